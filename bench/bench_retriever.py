"""Retriever throughput: in-process batched embed+search vs the HTTP server under concurrent clients.

One run, side by side on the same index and the same queries (ESConv valid counselor turns, i.e.
stage-1-like replies that are not in the train corpus):

- ``in-process b64``: ``RetrieverService.search_batch`` on batches of ``--batch`` queries (the ceiling);
- ``in-process b1``: the same, one query at a time (what a server without micro-batching would do);
- ``server cN``: ``escrag serve retriever`` as a separate process, N concurrent clients each sending
  single-query ``POST /retrieve`` requests; throughput and p50/p99 latency.

Target: the server at concurrency 64 reaches >= 70% of the in-process batched throughput.
Latency columns are per call: one batch for the in-process rows, one request for the server rows.
Prints a table and writes ``bench/results/retriever.json``.

    .venv/bin/python bench/bench_retriever.py                         # full size (run alone)
    .venv/bin/python bench/bench_retriever.py --chunks 200 --queries 128 --concurrency 1,16,64  # smoke
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from escrag.atomic import write_json  # noqa: E402
from escrag.config import load_config  # noqa: E402
from escrag.data import load_states  # noqa: E402
from escrag.web.procs import ServerProcess  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--index", default=None, help="existing index folder (default: build one of --chunks)")
    p.add_argument("--chunks", type=int, default=4000, help="corpus size when building the index")
    p.add_argument("--queries", type=int, default=1024, help="queries per measurement")
    p.add_argument("--batch", type=int, default=64, help="in-process batch size")
    p.add_argument("--concurrency", default="1,16,64", help="client concurrencies for the server")
    p.add_argument("--inprocess-single", type=int, default=128, help="queries for the batch-1 row (0: skip)")
    p.add_argument("--config", default=None)
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "retriever.json"))
    return p.parse_args(argv)


def get_index(args, cfg) -> Path:
    from retriever_server.build import build_index
    from retriever_server.index import read_manifest

    if args.index:
        return Path(args.index)
    out = ROOT / ".cache" / "bench" / f"retriever-index-{args.chunks}"
    if (out / "manifest.json").is_file() and read_manifest(out)["embedder"] == cfg.retriever.embedder:
        return out
    print(f"building a {args.chunks}-chunk index at {out} (once)", flush=True)
    return build_index(cfg, out=out, limit=args.chunks)


def queries(n: int) -> list[str]:
    texts = [s.target for s in load_states("valid") if len(s.target) >= 16]
    return [texts[i % len(texts)] for i in range(n)]


def in_process(service, qs: list[str], batch: int) -> dict:
    service.search_batch([(q, 3, None) for q in qs[:batch]])  # warm up
    lat, start = [], time.perf_counter()
    for i in range(0, len(qs), batch):
        t = time.perf_counter()
        service.search_batch([(q, 3, None) for q in qs[i:i + batch]])
        lat.append(time.perf_counter() - t)
    return summary(len(qs), time.perf_counter() - start, lat)


def summary(n: int, seconds: float, lat: list[float]) -> dict:
    ms = np.array(lat) * 1000
    return {"queries": n, "seconds": round(seconds, 3), "qps": round(n / seconds, 1),
            "p50_ms": round(float(np.percentile(ms, 50)), 1), "p99_ms": round(float(np.percentile(ms, 99)), 1)}


async def load(url: str, qs: list[str], concurrency: int) -> dict:
    """``concurrency`` clients, each sending single-query requests until ``qs`` is used up."""
    import httpx

    todo, lat = list(reversed(qs)), []
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        async def worker():
            while todo:
                q = todo.pop()
                t = time.perf_counter()
                resp = await client.post("/retrieve", json={"queries": [q], "k": 3})
                resp.raise_for_status()
                lat.append(time.perf_counter() - t)

        await asyncio.gather(*(client.post("/retrieve", json={"queries": [q], "k": 3}) for q in qs[:8]))
        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return summary(len(qs), time.perf_counter() - start, lat)


def batch_sizes(url: str) -> dict:
    import httpx

    text = httpx.get(f"{url}/metrics").text
    vals = {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
            if line.startswith("retriever_batch_size_")}
    return {"batches": vals.get("retriever_batch_size_count", 0), "queries": vals.get("retriever_batch_size_sum", 0)}


def run_server(index: Path, args, qs: list[str]) -> dict:
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        server = ServerProcess("retriever", ["retriever", "--index", str(index)]
                               + (["--config", args.config] if args.config else []), Path(tmp), timeout=300)
        url = server.url
        try:
            for c in [int(x) for x in args.concurrency.split(",")]:
                before = batch_sizes(url)
                rows[f"server c{c}"] = asyncio.run(load(url, qs, c))
                after = batch_sizes(url)
                n_batches = after["batches"] - before["batches"]
                rows[f"server c{c}"]["mean_batch"] = round((after["queries"] - before["queries"]) / max(n_batches, 1), 1)
        finally:
            server.stop()
    return rows


def main(argv=None) -> int:
    args = parse_args(argv)
    cfg = load_config(args.config)
    from escrag.embed import load_embedder
    from retriever_server.index import load_index
    from retriever_server.service import RetrieverService

    index_path = get_index(args, cfg)
    index = load_index(index_path, cfg.retriever.embedder, cfg.retriever)
    service = RetrieverService(index, load_embedder(cfg.retriever.embedder), cfg.retriever)
    qs = queries(args.queries)
    rows = {f"in-process b{args.batch}": in_process(service, qs, args.batch)}
    if args.inprocess_single:
        rows["in-process b1"] = in_process(service, qs[:args.inprocess_single], 1)
    del service  # free the cores' caches; the server loads its own copy
    rows.update(run_server(index_path, args, qs))
    base = rows[f"in-process b{args.batch}"]["qps"]
    print(f"\nindex: {index.count} chunks, {index.manifest['embedder']} ({index.manifest['index_type']}); "
          f"{args.queries} queries, {os.cpu_count()} CPUs")
    print(f"{'mode':<18}{'qps':>9}{'vs b' + str(args.batch):>9}{'p50 ms':>9}{'p99 ms':>9}{'mean batch':>12}")
    for name, r in rows.items():
        print(f"{name:<18}{r['qps']:>9.1f}{r['qps'] / base:>9.2f}{r['p50_ms']:>9.1f}{r['p99_ms']:>9.1f}"
              f"{r.get('mean_batch', ''):>12}")
    top = f"server c{max(int(x) for x in args.concurrency.split(','))}"
    ratio = rows[top]["qps"] / base if top in rows else None
    if ratio is not None:
        print(f"\n{top} / in-process b{args.batch} = {ratio:.2f} (target >= 0.70)")
    write_json(args.out, {"index": {"path": str(index_path), **index.manifest}, "queries": args.queries,
                          "batch": args.batch, "rows": rows, "server_vs_inprocess": ratio,
                          "target": 0.7, "cpus": os.cpu_count(), "time": time.strftime("%Y-%m-%dT%H:%M:%S")})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    from escrag.runtime import tune_process

    tune_process()
    sys.exit(main())
