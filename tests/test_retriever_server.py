"""The retriever end to end: `escrag index build` (through the CLI entry point) writes a small ESConv
index; `escrag serve retriever` serves it as a real process on a free loopback port behind a bearer
token; the real async client gets, for queries copied from corpus chunks, those chunks first (single
queries sent concurrently, and one batched call); bad input over the socket gets 4xx JSON; the CLI
refuses a wrong embedder, a missing index and bad build input with exit 2 and one line; the client
names the URL when a server is unreachable. Run: .venv/bin/python -m pytest -q tests/test_retriever_server.py"""

import asyncio
import json

import httpx
import pytest
from conftest import free_port

from escrag import cli
from escrag.config import RetrieverConfig
from escrag.data import load_states
from escrag.web.client import ServiceError
from retriever_server.client import RetrieverClient
from retriever_server.corpus import embed_text

N_CHUNKS = 24
KEY = "test-key"


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory):
    """Built through the command line's entry point (in this process, to share its loaded torch)."""
    out = tmp_path_factory.mktemp("retriever") / "index"
    assert cli.main(["index", "build", "--source", "esconv", "--out", str(out), "--limit", str(N_CHUNKS)]) == 0
    return out


def _chunks(index_dir):
    return [json.loads(line) for line in (index_dir / "chunks.jsonl").read_text().splitlines()]


async def _query(url, chunks):
    client = RetrieverClient(url, api_key=KEY)
    try:
        singles = await asyncio.gather(*(client.retrieve([embed_text(c)], k=3) for c in chunks[:8]))
        batched = await client.retrieve([embed_text(c) for c in chunks[8:16]], k=2)
        health = await client.health()
    finally:
        await client.aclose()
    denied = RetrieverClient(url, api_key="wrong")
    try:
        with pytest.raises(ServiceError, match=r"/retrieve rejected the request \(HTTP 401"):
            await denied.retrieve(["hello"], k=3)
    finally:
        await denied.aclose()
    return [s[0] for s in singles], batched, health


BAD_OVER_SOCKET = [  # (body bytes, status, fragment of the detail)
    (b'{"queries": []}', 422, "queries"),
    (b'{"queries": [""]}', 400, "must not be empty"),
    (b'{"queries": ["hi"], "k": 51}', 422, "k: "),
    (b'{"queries": [null]}', 422, "valid string"),
    (b"queries=hi", 422, "invalid JSON"),
    (b'{"queries": ["' + b"a" * (9 * 1024 * 1024) + b'"]}', 413, "larger than"),
]


def test_real_server_with_real_client(serve, index_dir):
    url = serve(["retriever", "--index", str(index_dir), "--api-key", KEY])
    chunks = _chunks(index_dir)
    singles, batched, health = asyncio.run(_query(url, chunks))
    train = {s.state_id: s for s in load_states("train")}
    for chunk, hits in zip(chunks[:8], singles):
        assert hits[0]["id"] == chunk["id"] and hits[0]["score"] > 0.99 and len(hits) == 3
        for hit in hits:  # every hit carries the ESConv labels of its counselor turn and dialogue
            gold = train[hit["id"]]
            assert hit["strategies"] == list(gold.strategies) and hit["strategies"], hit
            assert (hit["problem"], hit["emotion"], hit["stage"]) == (gold.problem, gold.emotion, ""), hit
    assert [hits[0]["id"] for hits in batched] == [c["id"] for c in chunks[8:16]]
    assert all(len(hits) == 2 for hits in batched)
    assert {k: health[k] for k in ("count", "embedder", "dim")} == \
        {"count": N_CHUNKS, "embedder": "packaged:minilm", "dim": 384}
    headers = {"Authorization": f"Bearer {KEY}", "content-type": "application/json"}
    for body, status, fragment in BAD_OVER_SOCKET:
        resp = httpx.post(f"{url}/retrieve", content=body, headers=headers, timeout=30)
        assert resp.status_code == status and fragment in resp.json()["detail"], (body[:40], resp.text)
    metrics = httpx.get(f"{url}/metrics").text
    assert 'retriever_requests_total{path="/retrieve",status="200"} 9.0' in metrics
    assert "retriever_batch_size_sum 16.0" in metrics and "retriever_request_seconds_bucket" in metrics


def test_cli_refuses_wrong_embedder_and_bad_build_input(index_dir, tmp_path, capsys):
    assert cli.main(["serve", "retriever", "--index", str(index_dir), "--embedder", "BAAI/bge-m3",
                     "--port", str(free_port())]) == 2
    assert "built with embedder 'packaged:minilm'" in capsys.readouterr().err
    assert cli.main(["serve", "retriever", "--index", str(tmp_path), "--port", str(free_port())]) == 2
    assert "not an index folder" in capsys.readouterr().err
    assert cli.main(["index", "build", "--source", "prefs", "--out", str(tmp_path / "i")]) == 2
    assert "needs a pairs file" in capsys.readouterr().err
    assert cli.main(["index", "build", "--source", "prefs", "--pairs", str(tmp_path / "nope.jsonl"),
                     "--out", str(tmp_path / "i")]) == 2
    assert "nope.jsonl: no such preference-pairs file" in capsys.readouterr().err
    assert not (tmp_path / "i").exists()
    summary = (index_dir / "manifest.json").read_text()
    assert f'"count": {N_CHUNKS}' in summary and '"embedder": "packaged:minilm"' in summary
    old = tmp_path / "old-index"  # built before hits carried labels: refused, with the command that rebuilds it
    old.mkdir()
    for f in index_dir.iterdir():
        (old / f.name).write_bytes(f.read_bytes())
    (old / "manifest.json").write_text(summary.replace('"format": 2', '"format": 1'))
    assert cli.main(["serve", "retriever", "--index", str(old), "--port", str(free_port())]) == 2
    err = capsys.readouterr().err
    assert "index format 1, this version reads format 2" in err and f"`escrag index build --out {old}`" in err, err


def test_client_names_url_of_unreachable_server():
    url = f"http://127.0.0.1:{free_port()}"

    async def main():
        client = RetrieverClient(url, RetrieverConfig(wait_s=0.5, backoff_s=0.01, timeout_s=5))
        try:
            await client.retrieve(["hello"], k=3)
        finally:
            await client.aclose()

    with pytest.raises(ServiceError, match=rf"POST {url}/retrieve failed after \d+ attempt\(s\) over \d+ s \(ConnectError"):
        asyncio.run(main())
