"""``escrag index build``: corpus -> embeddings -> FAISS index folder.

Owns: the build pipeline and its command-line handler. ``build_index(cfg, ...)`` is the function
the demo job calls; ``main(args)`` maps the command's flags onto it.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

from escrag.config import load_config, run_paths
from retriever_server.corpus import build_corpus, embed_text


def build_index(cfg, out: str | Path | None = None, source: str | None = None, pairs: str | None = None,
                limit: int | None = None) -> Path:
    """Build the corpus of ``source`` (default ``retriever.source``), embed it with
    ``retriever.embedder``, index it with ``retriever.index_type`` and save it to ``out``
    (default ``run_paths(cfg).index``); ``limit`` keeps the first N chunks. Returns the folder."""
    from escrag.embed import load_embedder
    from retriever_server.index import check_target, make_faiss_index, save_index

    rc = cfg.retriever
    out = Path(out or run_paths(cfg).index)
    check_target(out)  # fail before the slow part
    chunks = build_corpus(cfg, source, pairs, limit)
    embedder = load_embedder(rc.embedder, rc.device)
    vectors = embedder.encode([embed_text(c) for c in chunks], rc.embed_batch_size, progress=len(chunks) > 256)
    index = make_faiss_index(vectors, rc.index_type, rc)
    return save_index(out, index, chunks, embedder.name, rc.index_type)


def main(args) -> int:
    """Handler of ``escrag index build``."""
    cfg = load_config(args.config, args.override)
    changes = {k: v for k, v in (("embedder", args.embedder), ("index_type", args.index_type)) if v}
    cfg.retriever = dataclasses.replace(cfg.retriever, **changes)
    start = time.time()
    out = build_index(cfg, out=args.out, source=args.source, pairs=args.pairs, limit=args.limit)
    from retriever_server.index import read_manifest

    m = read_manifest(out)
    print(f"index: {m['count']} chunks x {m['dim']} ({m['index_type']}, {m['embedder']}) -> {out} "
          f"in {time.time() - start:.1f} s", file=sys.stderr)
    return 0
