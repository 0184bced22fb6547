"""The FAISS inner-product index and its folder on disk.

Owns: building a flat (exact, the default), HNSW or IVF inner-product index over normalised vectors;
saving it atomically as a folder (``index.faiss``, ``chunks.jsonl``, ``manifest.json``); loading it
back with checks (the embedder must be the one the manifest names, the corpus checksum and counts
must match); and batched search.

The folder is written with ``escrag.atomic.atomic_dir``, so a reader sees the old index or the new one,
never half of one, and never a moment without a folder. ``manifest.json``: ``{embedder, dim, count, corpus_sha256, built_at,
index_type, format}``. An index of another ``format`` (an older build, whose chunks lack the labels
every hit carries) is refused with the command that rebuilds it.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import faiss
import numpy as np

from escrag import atomic
from escrag.atomic import MANIFEST_FILE, atomic_dir
from escrag.errors import UserError
from retriever_server.corpus import dump_chunks, sha256

FORMAT = 2  # 2: chunks carry their ESConv labels (strategies, stage, problem, emotion)
INDEX_FILE, CHUNKS_FILE = "index.faiss", "chunks.jsonl"
IVF_MIN_POINTS_PER_LIST = 39  # FAISS warns below this many training points per cluster


def set_blas_threshold(n: int) -> None:
    """Batches of >= n queries use one BLAS matmul instead of a per-query loop (process-wide)."""
    faiss.cvar.distance_compute_blas_threshold = int(n)


def make_faiss_index(vectors: np.ndarray, index_type: str, rc) -> faiss.Index:
    """An inner-product index over ``vectors`` [n, dim]; ``rc`` is the ``RetrieverConfig``."""
    n, dim = vectors.shape
    if index_type == "flat":
        index = faiss.IndexFlatIP(dim)
    elif index_type == "hnsw":
        index = faiss.IndexHNSWFlat(dim, rc.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = rc.hnsw_ef_construction
    elif index_type == "ivf":
        nlist = max(1, min(rc.ivf_nlist, n // IVF_MIN_POINTS_PER_LIST))
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, nlist, faiss.METRIC_INNER_PRODUCT)
        index.train(vectors)
    else:
        raise UserError(f"unknown index type {index_type!r} (known: flat, hnsw, ivf)")
    index.add(vectors)
    tune(index, rc)
    return index


def tune(index: faiss.Index, rc) -> None:
    """Search-time settings from the config (HNSW efSearch, IVF nprobe, the BLAS threshold)."""
    set_blas_threshold(rc.blas_threshold)
    if isinstance(index, faiss.IndexHNSW):
        index.hnsw.efSearch = rc.hnsw_ef_search
    elif isinstance(index, faiss.IndexIVF):
        index.nprobe = min(rc.ivf_nprobe, index.nlist)


class VectorIndex:
    """A FAISS index with its chunks (row i of the index is ``chunks[i]``) and manifest."""

    def __init__(self, index: faiss.Index, chunks: list[dict], manifest: dict):
        self.index, self.chunks, self.manifest = index, chunks, manifest
        per_dialogue = Counter(c.get("dialogue_id") for c in chunks if c.get("dialogue_id"))
        self.max_per_dialogue = max(per_dialogue.values(), default=0)  # chunks one exclusion can remove

    @property
    def count(self) -> int:
        return self.index.ntotal

    def search(self, vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """[q, dim] -> scores [q, k'] and row ids [q, k'] (k' = min(k, count)); -1 marks no hit."""
        k = min(k, self.count)
        return self.index.search(np.ascontiguousarray(vectors, dtype=np.float32), k)


def save_index(out: str | Path, index: faiss.Index, chunks: list[dict], embedder: str,
               index_type: str) -> Path:
    """Write the index folder atomically (``escrag.atomic.atomic_dir``); returns its path."""
    out = Path(out)
    data = dump_chunks(chunks)
    manifest = {"embedder": embedder, "dim": index.d, "count": index.ntotal, "corpus_sha256": sha256(data),
                "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "index_type": index_type, "format": FORMAT}
    check_target(out)
    with atomic_dir(out) as tmp:
        faiss.write_index(index, str(tmp / INDEX_FILE))
        (tmp / CHUNKS_FILE).write_bytes(data)
        (tmp / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n")
    return out


def check_target(out: str | Path) -> None:
    """``out`` may be replaced: it is absent, an empty folder or an index folder."""
    out = Path(out)
    if out.exists() and not (out.is_dir() and ((out / MANIFEST_FILE).is_file() or not any(out.iterdir()))):
        raise UserError(f"{out}: exists and is not an index folder; refusing to replace it")


def read_manifest(folder: str | Path) -> dict:
    return atomic.read_manifest(folder, "an index folder", "build one with `escrag index build --out DIR`",
                                ("embedder", "dim", "count", "corpus_sha256", "index_type"))


def check_format(folder: str | Path, manifest: dict) -> None:
    if manifest.get("format") != FORMAT:
        raise UserError(f"{folder}: index format {manifest.get('format')!r}, this version reads format {FORMAT} "
                        "(its chunks carry each exemplar's ESConv strategy, problem and emotion); rebuild it with "
                        f"`escrag index build --out {folder}` (add the --source/--pairs it was built with)")


def check_embedder(folder: str | Path, manifest: dict, embedder: str | None) -> None:
    if embedder is not None and embedder != manifest["embedder"]:
        raise UserError(f"{folder}: index was built with embedder {manifest['embedder']!r} "
                        f"({manifest['dim']}-d), not {embedder!r}; serve it with --embedder "
                        f"{manifest['embedder']} or rebuild it with --embedder {embedder}")


def load_index(folder: str | Path, embedder: str | None = None, rc=None) -> VectorIndex:
    """Load and check an index folder; ``embedder`` (a spec) must match the manifest when given."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    check_format(folder, manifest)
    check_embedder(folder, manifest, embedder)
    data = (folder / CHUNKS_FILE).read_bytes() if (folder / CHUNKS_FILE).is_file() else b""
    if sha256(data) != manifest["corpus_sha256"]:
        raise UserError(f"{folder / CHUNKS_FILE}: missing or changed since the index was built "
                        "(checksum differs from manifest.json); rebuild the index")
    try:
        index = faiss.read_index(str(folder / INDEX_FILE))
    except RuntimeError as exc:
        raise UserError(f"{folder / INDEX_FILE}: cannot read FAISS index ({str(exc).splitlines()[0]})") from None
    chunks = [json.loads(line) for line in data.decode("utf-8").splitlines() if line]
    if not (index.ntotal == len(chunks) == manifest["count"]) or index.d != manifest["dim"]:
        raise UserError(f"{folder}: index holds {index.ntotal} x {index.d}, chunks.jsonl {len(chunks)}, "
                        f"manifest {manifest['count']} x {manifest['dim']}; rebuild the index")
    if rc is not None:
        tune(index, rc)
    return VectorIndex(index, chunks, manifest)
