"""Rollout throughput: the two-stage RAG episode with live retriever and reward servers vs the raw
engine doing the same generation work, plus groups/s of the Ray pool with 1 and 2 workers.

- ``rollout``: ``run_groups`` over S states (N samples each): stage 1, retrieval over HTTP, stage 2,
  reward over HTTP; generated tokens / wall time. The groups' requests join the engine's running
  batch as they come (continuous batching).
- ``raw engine``: the same requests (same prompt ids, seeds and sampling params) with no HTTP and no
  waiting: all stage-1 rows in one ``generate`` call, then all stage-2 rows, i.e. the engine at the
  largest batch the rollout could reach; generated tokens / wall time.
  overhead = 1 - rollout tok/s / raw tok/s (issue 12: rollout >= 0.9 of raw, overhead <= 10%).
  ``mean batch`` is the engine's mean live rows per decode step in each run.
- ``pool (W workers)``: ``RolloutPool.generate`` on the same states, groups/s (after a warm-up batch).
Rollout and raw runs alternate ``--repeats`` times; the table shows the median. The engine's prefix
cache is cleared before each run (so neither run reuses the other's K/V).

Run (the lead's full run, alone on the machine):
  .venv/bin/python bench/bench_rollout.py
Smoke run (tiny model, seconds):
  .venv/bin/python bench/bench_rollout.py --model tiny-random:qwen2 --states 2 --group-size 2 \\
      --max-new1 8 --max-new2 8 --index-limit 40 --workers 1
Writes bench/results/rollout.json. ``--set rollout.compile=true`` (repeatable) overrides the config.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from escrag.atomic import write_json  # noqa: E402
from escrag.web.procs import ServerProcess  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/cpu-demo.yaml")
    p.add_argument("--model", default=None, help="policy spec (default: the config's policy.model)")
    p.add_argument("--states", type=int, default=8, help="dialogue states per batch")
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--max-new1", type=int, default=64)
    p.add_argument("--max-new2", type=int, default=80)
    p.add_argument("--index-limit", type=int, default=2000, help="chunks in the benchmark index")
    p.add_argument("--index", default=None, help="use this built index instead of building one")
    p.add_argument("--reward", default="rule:length:30",
                   help="'rule:NAME:ARG' for a rule reward server, or 'rm:DIR' for a trained head")
    p.add_argument("--workers", default="1,2", help="pool sizes to time; '' skips the pool")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=0, help="torch threads of the driver's engine (0: default)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "rollout.json"))
    return p.parse_args(argv)


class Recorder:
    """Passes the episodes' requests to the engine's scheduler and keeps them for the raw replay."""

    is_async = True

    def __init__(self, sched):
        self.sched, self.tokenizer, self.calls = sched, sched.tokenizer, []

    async def generate(self, prompt_ids, params, seeds=None):
        self.calls.append((prompt_ids, params, seeds))
        return await self.sched.generate(prompt_ids, params, seeds)


def _engine_counters(engine) -> dict:
    return dict(getattr(engine, "stats", {}))


def _mean_batch(engine, before: dict) -> float | None:
    after = _engine_counters(engine)
    steps = after.get("steps", 0) - before.get("steps", 0)
    return (after["decode_rows"] - before["decode_rows"]) / steps if steps else None


def time_rollout(engine, states, cfg, urls):
    from retriever_server.client import RetrieverClient
    from reward_server.client import RewardClient
    from rollout.episode import as_scheduler, run_groups

    rec = Recorder(as_scheduler(engine, cfg.rollout.max_batch))

    async def go():
        return await run_groups(states, rec, RetrieverClient(urls["retriever"], cfg.retriever),
                                RewardClient(urls["reward"], cfg.reward), cfg, 0)

    clear_prefix_cache(engine)
    before, t = _engine_counters(engine), time.perf_counter()
    groups = asyncio.run(go())
    wall = time.perf_counter() - t
    tokens = sum(g.stats["stage1_tokens"] + g.stats["stage2_tokens"] for g in groups)
    return {"tokens": tokens, "seconds": wall, "tok_s": tokens / wall, "requests": len(rec.calls),
            "mean_batch": _mean_batch(engine, before)}, rec.calls


def time_raw(engine, calls):
    """All rows of each stage (same params) in one ``generate`` call, stage 1 first."""
    stages: dict = {}
    for prompts, params, seeds in calls:
        rows = stages.setdefault(params, ([], []))
        rows[0].extend(prompts)
        rows[1].extend(seeds)
    clear_prefix_cache(engine)
    before, t, tokens = _engine_counters(engine), time.perf_counter(), 0
    for params, (prompts, seeds) in stages.items():
        tokens += sum(len(g.token_ids) for g in engine.generate(prompts, params, seeds))
    wall = time.perf_counter() - t
    return {"tokens": tokens, "seconds": wall, "tok_s": tokens / wall, "engine_calls": len(stages),
            "mean_batch": _mean_batch(engine, before)}


def clear_prefix_cache(engine) -> None:
    if getattr(engine, "prefix_cache", None) is not None:
        engine.prefix_cache.clear()


def time_pool(cfg, states, urls, workers: int):
    from rollout.pool import RolloutPool

    cfg.rollout.num_workers = workers
    cfg.rollout.worker_cpus = 0.1
    pool = RolloutPool(cfg, urls["retriever"], urls["reward"])
    try:
        pool.generate(states[:1], [0])  # warm-up: actor start and model load are not timed
        t = time.perf_counter()
        groups = pool.generate(states, list(range(len(states))))
        wall = time.perf_counter() - t
    finally:
        pool.shutdown()
    return {"workers": workers, "groups": len(groups), "seconds": wall, "groups_s": len(groups) / wall}


def setup(args, tmp: Path):
    from escrag.config import load_config

    over = [f"rollout.group_size={args.group_size}", f"rollout.max_new_tokens_stage1={args.max_new1}",
            f"rollout.max_new_tokens_stage2={args.max_new2}", *args.set]
    if args.model:
        over.append(f"policy.model={args.model}")
    cfg = load_config(ROOT / args.config, over)
    index = args.index
    if index is None:
        index = str(tmp / "index")
        subprocess.run([sys.executable, "-m", "escrag", "index", "build", "--source", "esconv", "--out",
                        index, "--limit", str(args.index_limit)], check=True, cwd=ROOT)
    kind, _, spec = args.reward.partition(":")
    reward_args = ["--rule", spec] if kind == "rule" else ["--rm", spec]
    procs, urls = [], {}
    for name, sargs in (("retriever", ["retriever", "--index", index]), ("reward", ["reward", *reward_args])):
        procs.append(ServerProcess(name, sargs, tmp, timeout=300))
        urls[name] = procs[-1].url
    return cfg, procs, urls


def print_table(res: dict) -> None:
    r, b = res["rollout"], res["raw_engine"]
    mb = lambda x: f"{x['mean_batch']:>12.1f}" if x.get("mean_batch") else f"{'-':>12}"  # noqa: E731
    print(f"\n{'variant':<28}{'tokens':>8}{'seconds':>10}{'tok/s':>9}{'mean batch':>12}")
    print(f"{'two-stage rollout (HTTP)':<28}{r['tokens']:>8}{r['seconds']:>10.2f}{r['tok_s']:>9.1f}{mb(r)}")
    print(f"{'raw engine, same rows':<28}{b['tokens']:>8}{b['seconds']:>10.2f}{b['tok_s']:>9.1f}{mb(b)}")
    print(f"rollout / raw: {r['tok_s'] / b['tok_s']:.2f} (target >= 0.9); overhead {100 * res['overhead']:.1f}%")
    print(f"engine: {res['engine']}, warm-up (1 state, includes compiling): {res['warmup_s']:.1f} s")
    for p in res["pool"]:
        print(f"pool, {p['workers']} worker(s): {p['groups']} groups in {p['seconds']:.2f} s = "
              f"{p['groups_s']:.3f} groups/s")


def main(argv=None) -> int:
    args = parse_args(argv)
    from escrag.data import load_states
    from rollout.engines import make_engine

    with tempfile.TemporaryDirectory(prefix="bench-rollout-") as tmp:
        cfg, procs, urls = setup(args, Path(tmp))
        try:
            states = load_states("valid")[: args.states]
            if args.threads:
                import torch

                torch.set_num_threads(args.threads)
            engine = make_engine(cfg)
            warmup_s = time_rollout(engine, states[:1], cfg, urls)[0]["seconds"]  # includes any compile
            runs, raws = [], []
            for _ in range(args.repeats):
                r, calls = time_rollout(engine, states, cfg, urls)
                runs.append(r)
                raws.append(time_raw(engine, calls))
            med = lambda xs: sorted(xs, key=lambda x: x["tok_s"])[len(xs) // 2]  # noqa: E731
            res = {"config": vars(args), "model": cfg.policy.model, "rollout": med(runs),
                   "raw_engine": med(raws), "runs": runs, "raw_runs": raws, "pool": [], "warmup_s": warmup_s,
                   "engine": {"dtype": getattr(engine, "dtype", None), "compile": cfg.rollout.compile}}
            res["overhead"] = 1 - res["rollout"]["tok_s"] / res["raw_engine"]["tok_s"]
            res["overhead_median_of_pairs"] = statistics.median(
                1 - r["tok_s"] / b["tok_s"] for r, b in zip(runs, raws))
            sizes = [int(w) for w in args.workers.split(",") if w.strip()]
            if sizes:
                from escrag.raylocal import init_ray

                init_ray(num_cpus=max(2, max(sizes)), tmpdir=str(ROOT / ".cache" / "ray-bench"))
                res["pool"] = [time_pool(cfg, states, urls, w) for w in sizes]
        finally:
            for p in procs:
                p.stop()
    print_table(res)
    out = write_json(args.out, json.loads(json.dumps(res, default=str)))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    from escrag.runtime import tune_process

    tune_process()
    sys.exit(main())
