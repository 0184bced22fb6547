"""Embedder, FAISS index folder and retrieval logic in-process, with the real all-MiniLM-L6-v2:
normalised embeddings; a small ESConv index saved atomically with its manifest and loaded back;
loading refuses another embedder or a changed corpus; HNSW and IVF agree with exact search on real
embeddings; a query copied from a chunk returns that chunk first; the FastAPI app (in-process over
ASGI) coalesces concurrent single-query requests into batches and answers bad input with 4xx JSON.
Run: .venv/bin/python -m pytest -q tests/test_retriever_index.py"""

import asyncio
import dataclasses
import json
import re
import shutil

import faiss
import httpx
import numpy as np
import pytest

from escrag.config import load_config
from escrag.embed import load_embedder
from escrag.errors import UserError
from retriever_server.build import build_index
from retriever_server.corpus import embed_text
from retriever_server.index import load_index, make_faiss_index, read_manifest
from retriever_server.server import build_app
from retriever_server.service import RetrieverService

N_CHUNKS = 64


@pytest.fixture(scope="module")
def embedder():
    return load_embedder("packaged:minilm")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("idx") / "index"
    cfg = load_config()
    return cfg, build_index(cfg, out=out, limit=N_CHUNKS)


@pytest.fixture(scope="module")
def index(built):
    cfg, out = built
    return load_index(out, "packaged:minilm", cfg.retriever)


def test_embedder_rows_are_normalised(embedder):
    vecs = embedder.encode(["I lost my job and feel anxious.", "My dog died.", "x"], batch_size=2)
    assert embedder.name == "packaged:minilm" and embedder.dim == 384
    assert vecs.dtype == np.float32 and vecs.shape == (3, 384)
    assert np.allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)
    assert embedder.encode([]).shape == (0, 384)


def test_folder_manifest_and_atomic_rebuild(built, index, tmp_path):
    cfg, out = built
    m = read_manifest(out)
    assert {k: m[k] for k in ("embedder", "dim", "count", "index_type")} == \
        {"embedder": "packaged:minilm", "dim": 384, "count": N_CHUNKS, "index_type": "flat"}
    assert len(m["corpus_sha256"]) == 64 and m["built_at"]
    assert index.count == N_CHUNKS and faiss.cvar.distance_compute_blas_threshold == cfg.retriever.blas_threshold
    copy = tmp_path / "index"
    shutil.copytree(out, copy)
    build_index(cfg, out=copy, limit=3)  # replacing an existing index leaves no temp folder behind
    assert read_manifest(copy)["count"] == 3 and load_index(copy).count == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index"]
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "file").write_text("x")
    with pytest.raises(UserError, match="not an index folder"):
        build_index(cfg, out=tmp_path / "junk", limit=3)
    assert (tmp_path / "junk" / "file").read_text() == "x"


def test_load_refuses_other_embedder_and_changed_corpus(built, tmp_path):
    cfg, out = built
    with pytest.raises(UserError, match=r"built with embedder 'packaged:minilm'.*not 'BAAI/bge-m3'"):
        load_index(out, "BAAI/bge-m3")
    with pytest.raises(UserError, match="not an index folder"):
        load_index(tmp_path)
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in out.iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    with (broken / "chunks.jsonl").open("a") as fh:
        fh.write(json.dumps({"id": "extra"}) + "\n")
    with pytest.raises(UserError, match="checksum"):
        load_index(broken)


def test_hnsw_and_ivf_agree_with_flat(index):
    """Real embeddings: the first 48 chunks are indexed, the other chunks are the queries."""
    vecs = index.index.reconstruct_n(0, index.count)
    base, queries = vecs[:48], vecs[48:]
    rc = dataclasses.replace(load_config().retriever, ivf_nlist=64, ivf_nprobe=1)
    scores, exact = make_faiss_index(base, "flat", rc).search(queries, 3)
    for kind in ("hnsw", "ivf"):
        got_scores, got = make_faiss_index(base, kind, rc).search(queries, 3)
        assert (got[:, 0] == exact[:, 0]).mean() >= 0.9, kind
        assert np.allclose(got_scores[:, 0], scores[:, 0], atol=1e-4), kind  # inner products, not L2
    ivf = make_faiss_index(base, "ivf", rc)  # 48 points: capped at one list (>= 39 points each)
    assert ivf.nlist == 1 and ivf.nprobe == 1


def test_copied_chunk_comes_first(index, embedder):
    service = RetrieverService(index, embedder, load_config().retriever)
    picks = [index.chunks[i] for i in (3, 30, 63)]
    results = service.search_batch([(embed_text(c), 3, None) for c in picks] + [("I feel so alone.", 5, None)])
    for chunk, hits in zip(picks, results):
        assert hits[0]["id"] == chunk["id"] and hits[0]["score"] > 0.99
        assert hits[0]["history"] == chunk["history"] and hits[0]["response"] == chunk["response"]
        assert [h["score"] for h in hits] == sorted((h["score"] for h in hits), reverse=True)
    assert [len(h) for h in results] == [3, 3, 3, 5]


def test_excluding_a_dialogue_still_returns_k_hits(index, embedder):
    service = RetrieverService(index, embedder, load_config().retriever)
    chunk = index.chunks[30]
    own = [c for c in index.chunks if c["dialogue_id"] == chunk["dialogue_id"]]
    assert len(own) >= 5 and index.max_per_dialogue >= len(own)
    (plain,), (kept,) = (service.search_batch([(embed_text(chunk), len(own), x)]) for x in (None, chunk["dialogue_id"]))
    assert plain[0]["id"] == chunk["id"]
    assert len(kept) == len(own) and not any(h["id"] in {c["id"] for c in own} for h in kept)


def _metric(text: str, name: str) -> float:
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " "))


async def _call(app, requests):
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
        answers = await asyncio.gather(*(client.post("/retrieve", **kw) for kw in requests))
        return answers, (await client.get("/metrics")).text


def test_app_coalesces_concurrent_queries(index, embedder):
    """24 single-query requests: two micro-batches of 12 (closed on count), each embedded in forwards of
    ``retriever.forward_batch`` (4): 6 forwards of the model, each hit still the query's own chunk."""
    rc = dataclasses.replace(load_config().retriever, max_wait_ms=600_000, embed_batch_size=12, forward_batch=4)
    app = build_app(RetrieverService(index, embedder, rc))
    queries = [embed_text(c) for c in index.chunks[:24]]
    forwards = []
    hook = embedder.model.register_forward_hook(lambda _m, args, _out: forwards.append(1))
    try:
        answers, metrics = asyncio.run(_call(app, [{"json": {"queries": [q], "k": 2}} for q in queries]))
    finally:
        hook.remove()
    assert len(forwards) == 6
    assert [a.status_code for a in answers] == [200] * 24
    assert [a.json()["results"][0][0]["id"] for a in answers] == [c["id"] for c in index.chunks[:24]]
    assert _metric(metrics, "retriever_batch_size_sum") == 24
    assert _metric(metrics, "retriever_batch_size_count") == 2  # 24 single-query requests, two embed calls
    assert _metric(metrics, "retriever_queries_total") == 24


BAD = [  # (request kwargs, status, fragment of the detail)
    ({"json": {"queries": []}}, 422, "queries"),
    ({"json": {"queries": ["  "]}}, 400, "queries[0]: must not be empty"),
    ({"json": {"queries": [7]}}, 422, "valid string"),
    ({"json": {"queries": "one query"}}, 422, "valid list"),
    ({"json": {"queries": ["hi"], "k": 0}}, 422, "k: "),
    ({"json": {"queries": ["hi"], "k": 51}}, 422, "k: "),
    ({"json": {"queries": ["hi"], "k": "3"}}, 422, "k: "),
    ({"json": {"queries": ["hi"], "return_scores": "yes"}}, 422, "return_scores"),
    ({"json": {"queries": ["hi"], "topk": 3}}, 422, "topk"),
    ({"json": {"queries": ["x" * 9000]}}, 400, "longer than 8000"),
    ({"json": {"queries": ["q"] * 300}}, 400, "at most 256"),
    ({"json": [1, 2]}, 422, "body"),
    ({"content": b"{not json", "headers": {"content-type": "application/json"}}, 422, "invalid JSON"),
    ({"json": {"queries": ["a"]}, "headers": {"content-length": "99999999"}}, 413, "larger than"),
]


def test_app_bad_input_table(index, embedder):
    app = build_app(RetrieverService(index, embedder, load_config().retriever))
    answers, _ = asyncio.run(_call(app, [kw for kw, _, _ in BAD]))
    for (kw, status, fragment), ans in zip(BAD, answers):
        assert ans.status_code == status, (kw, ans.text)
        assert fragment in ans.json()["detail"], (kw, ans.text)


def test_app_overload_and_scoreless_answers(index, embedder):
    rc = dataclasses.replace(load_config().retriever, max_queue=2)
    app = build_app(RetrieverService(index, embedder, rc))
    answers, _ = asyncio.run(_call(app, [{"json": {"queries": ["a", "b", "c"]}},
                                         {"json": {"queries": ["a"], "return_scores": False}}]))
    assert answers[0].status_code == 503 and answers[0].headers["retry-after"] == "1"
    hits = answers[1].json()["results"][0]
    assert len(hits) == 3 and set(hits[0]) == {"id", "history", "response", "strategies", "stage", "problem", "emotion"}


def test_bad_manifest_names_the_folder_or_file(tmp_path):
    missing = f"{tmp_path}: not an index folder (no manifest.json; build one with `escrag index build --out DIR`)"
    with pytest.raises(UserError, match="^" + re.escape(missing)):
        read_manifest(tmp_path)
    path = tmp_path / "manifest.json"
    for text, why in (("{", "invalid JSON"), ("[1]", "not a JSON object"),
                      ('{"embedder": "x", "dim": 3}', "missing field(s) count, corpus_sha256, index_type")):
        path.write_text(text)
        with pytest.raises(UserError, match=re.escape(f"{path}: {why}")):
            read_manifest(tmp_path)
