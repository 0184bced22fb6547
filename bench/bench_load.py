"""Load on the three servers: 1 to 128 concurrent clients, a long run with the server's memory, a kill.

Each server is a real ``escrag serve`` process on loopback (``escrag.web.procs.ServerProcess``); the
clients are ``--levels`` concurrent loops in this process (httpx, one connection each), each sending
one-item requests until the level's ``--seconds`` are up; requests still in flight then finish (so a
level's wall time can pass its ``--seconds``). Every ``--bad-every``-th request of a client is bad input,
which must get a 4xx. A 503 must carry ``Retry-After``, which the client then waits. The queue bounds are
set to ``--queue`` (64) so that the 128-client level passes them: the servers' 503 path runs too.

- reward (``escrag serve reward --rm``, ``--reward-backbone`` with a seeded random head: throughput
  does not depend on the head's weights): ``POST /score`` and ``POST /get_reward`` (OpenRLHF's shape);
  beside it the in-process ``RewardModel.score`` at batch 1 and batch ``max_batch``, the most any
  micro-batcher can gain on this model;
- retriever (``escrag serve retriever``, all-MiniLM-L6-v2 over a ``--chunks`` ESConv index): ``POST /retrieve``;
- counselor (``escrag serve counselor``, ``--counselor-policy`` tiny random, configs/cpu-test.yaml, the
  retriever above, its crisis check on SmolLM2 as shipped): ``POST /v1/chat/completions``.

After its levels each server runs ``--long-seconds`` at ``--long-clients`` (the reward server: clients
alternate /score and /get_reward), its RSS read from /proc every ``--rss-every`` s; growth is measured
from the sample at ``--warmup-seconds`` to the last. Last, the fault: a reward server started and
watched by the training job's own ``ray_jobs.services.JobServices`` serves ``--long-clients`` looping
``RewardClient.score`` calls (the rollout's client, the job's retry settings); at ``--kill-after`` s it
gets SIGKILL, the job restarts it; every call must end in a score or an error, none past its bound
(``reward.wait_s + reward.timeout_s``), and no episode may be lost.

Goals (``goals`` in the JSON): no answer but 200, a 4xx for bad input and a 503 with Retry-After; RSS
growth under 5% over the long run; for the reward server and the retriever, throughput at 32 clients at
least 3x that at 1.

    flock /tmp/escrag-heavy.lock .venv/bin/python bench/bench_load.py           # ~30 min, run alone
    .venv/bin/python bench/bench_load.py --smoke                                # tiny models, ~3 min
Prints a table and writes bench/results/load.json.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_retriever import get_index, queries  # noqa: E402
from bench.bench_reward_server import make_items, random_head  # noqa: E402
from escrag.atomic import write_json  # noqa: E402
from escrag.config import load_config, to_dict  # noqa: E402
from escrag.web.procs import ServerProcess  # noqa: E402

GOAL_RSS_GROWTH, GOAL_BATCHING = 0.05, 3.0


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--servers", default="reward,retriever,counselor,fault")
    p.add_argument("--levels", default="1,8,32,128")
    p.add_argument("--seconds", type=float, default=20.0, help="per level")
    p.add_argument("--long-seconds", type=float, default=300.0)
    p.add_argument("--long-clients", type=int, default=32)
    p.add_argument("--warmup-seconds", type=float, default=30.0, help="into the long run: where RSS growth starts")
    p.add_argument("--rss-every", type=float, default=5.0)
    p.add_argument("--bad-every", type=int, default=20)
    p.add_argument("--queue", type=int, default=64, help="max_queue of every server")
    p.add_argument("--timeout", type=float, default=300.0, help="one request's bound; past it: a hang")
    p.add_argument("--reward-backbone", default="packaged:smollm2-135m-instruct")
    p.add_argument("--reward-dtype", default="auto")
    p.add_argument("--reward-max-length", type=int, default=256)
    p.add_argument("--chunks", type=int, default=4000)
    p.add_argument("--counselor-policy", default="tiny-random:qwen2")
    p.add_argument("--kill-after", type=float, default=20.0)
    p.add_argument("--fault-seconds", type=float, default=60.0)
    p.add_argument("--smoke", action="store_true", help="tiny reward backbone, short levels (not for the JSON)")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "load.json"))
    args = p.parse_args(argv)
    if args.smoke:
        args.reward_backbone, args.seconds, args.long_seconds, args.warmup_seconds = "tiny-random:qwen2", 3, 20, 5
        args.chunks, args.kill_after, args.fault_seconds, args.rss_every = 200, 3, 8, 2
        if args.out == p.get_default("out"):
            args.out = str(ROOT / ".cache" / "bench" / "load-smoke.json")
    return args


# --- what the clients send -------------------------------------------------------------------------

def chatml(history: list[dict]) -> str:
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in history) + "<|im_start|>assistant\n"


def workloads(items: list[dict], texts: list[str], counsel: list[list[dict]]) -> dict:
    """name -> (one good request for client i's n-th call, a bad one): (path, JSON body)."""
    def score(i):
        return "/score", {"items": [items[i % len(items)]]}

    def get_reward(i):
        it = items[i % len(items)]
        prompt = chatml(it["history"])
        return "/get_reward", {"query": [prompt + it["output"] + "<|im_end|>"], "prompts": [prompt]}

    return {
        "reward /score": (score, ("/score", {"items": [{"history": [], "output": "x"}]})),
        "reward /get_reward": (get_reward, ("/get_reward", {"query": ["a"], "prompts": ["b"]})),
        "reward /score + /get_reward": (lambda i: (score if i % 2 else get_reward)(i),
                                        ("/score", {"items": "none"})),
        "retriever /retrieve": (lambda i: ("/retrieve", {"queries": [texts[i % len(texts)]], "k": 3}),
                                ("/retrieve", {"queries": [""]})),
        "counselor /v1/chat/completions": (
            lambda i: ("/v1/chat/completions", {"model": "counselor", "messages": counsel[i % len(counsel)], "seed": i}),
            ("/v1/chat/completions", {"messages": [{"role": "assistant", "content": "hi"}]})),
    }


# --- one level of load -----------------------------------------------------------------------------

class Tally:
    def __init__(self):
        self.latency, self.statuses, self.bad, self.errors = [], Counter(), Counter(), Counter()
        self.no_retry_after = 0

    def record(self, bad: bool, status: int, seconds: float, retry_after: str | None) -> None:
        (self.bad if bad else self.statuses)[str(status)] += 1
        if status == 200 and not bad:
            self.latency.append(seconds)
        if status == 503 and not retry_after:
            self.no_retry_after += 1

    def unexpected(self) -> int:
        """Answers outside the goal: a good request not 200 / 503, bad input not 4xx, a 503 without
        Retry-After, no answer at all (connection errors, timeouts)."""
        good = sum(n for s, n in self.statuses.items() if s not in ("200", "503"))
        bad = sum(n for s, n in self.bad.items() if not (s.startswith("4") or s == "503"))
        return good + bad + self.no_retry_after + sum(self.errors.values())

    def summary(self, seconds: float) -> dict:
        ms = np.array(self.latency or [float("nan")]) * 1000
        return {"seconds": round(seconds, 1), "ok": len(self.latency), "ok_per_s": round(len(self.latency) / seconds, 2),
                "p50_ms": round(float(np.percentile(ms, 50)), 1), "p99_ms": round(float(np.percentile(ms, 99)), 1),
                "statuses": dict(self.statuses), "bad_input_statuses": dict(self.bad),
                "503_without_retry_after": self.no_retry_after, "errors": dict(self.errors),
                "unexpected": self.unexpected()}


async def level(url: str, workload, clients: int, seconds: float, args) -> dict:
    import httpx

    good, bad = workload
    tally, deadline = Tally(), time.monotonic() + seconds
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)

    async def client(c: int):  # a pool of its own: one shared pool of 128 costs the clients' CPU O(n) a request
        async with httpx.AsyncClient(base_url=url, timeout=args.timeout, limits=limits) as http:
            n = 0
            while time.monotonic() < deadline:
                n += 1
                is_bad = args.bad_every and n % args.bad_every == 0
                path, body = bad if is_bad else good(c * 1_000_003 + n)
                start = time.perf_counter()
                try:
                    r = await asyncio.wait_for(http.post(path, json=body), args.timeout)
                except (TimeoutError, httpx.HTTPError) as exc:
                    tally.errors[type(exc).__name__] += 1
                    continue
                tally.record(is_bad, r.status_code, time.perf_counter() - start, r.headers.get("retry-after"))
                if r.status_code == 503:
                    await asyncio.sleep(float(r.headers.get("retry-after") or 1))

    start = time.perf_counter()
    await asyncio.gather(*(client(c) for c in range(clients)))
    return tally.summary(time.perf_counter() - start)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    raise RuntimeError(f"no VmRSS for pid {pid}")


async def long_run(url: str, pid: int, workload, args) -> dict:
    samples, start = [], time.monotonic()

    async def sample():
        while True:
            samples.append([round(time.monotonic() - start, 1), rss_mb(pid)])
            await asyncio.sleep(args.rss_every)

    sampler = asyncio.create_task(sample())
    row = await level(url, workload, args.long_clients, args.long_seconds, args)
    sampler.cancel()
    samples.append([round(time.monotonic() - start, 1), rss_mb(pid)])
    warm = next(mb for t, mb in samples if t >= args.warmup_seconds)
    return {"clients": args.long_clients, **row, "rss_mb_start": samples[0][1], "rss_mb_after_warmup": warm,
            "rss_mb_end": samples[-1][1], "rss_growth": round(samples[-1][1] / warm - 1, 4), "rss_samples": samples}


def sweep(url: str, pid: int, names: list[str], long_name: str, loads: dict, args) -> dict:
    for _ in range(4):  # warm up: the first requests load lazily built parts
        asyncio.run(level(url, loads[names[0]], 2, 0.01, args))
    out = {"levels": {}}
    for name in names:
        out["levels"][name] = {}
        for clients in args.levels:
            row = asyncio.run(level(url, loads[name], clients, args.seconds, args))
            out["levels"][name][str(clients)] = row
            print(f"{name:<34}{clients:>6}{row['ok_per_s']:>10.2f}{row['p50_ms']:>10.0f}{row['p99_ms']:>10.0f}"
                  f"  {row['statuses']} bad {row['bad_input_statuses']} errors {row['errors']}", flush=True)
    out["long"] = {"workload": long_name, **asyncio.run(long_run(url, pid, loads[long_name], args))}
    lr = out["long"]
    print(f"{long_name:<34}{args.long_clients:>6}{lr['ok_per_s']:>10.2f}{lr['p50_ms']:>10.0f}{lr['p99_ms']:>10.0f}"
          f"  {lr['seconds']} s, RSS {lr['rss_mb_start']} -> {lr['rss_mb_after_warmup']} -> {lr['rss_mb_end']} MB "
          f"({lr['rss_growth']:+.1%}) {lr['statuses']} errors {lr['errors']}", flush=True)
    return out


# --- the servers -----------------------------------------------------------------------------------

def reward_inprocess(head: Path, items: list[dict], max_batch: int) -> dict:
    """items/s of ``RewardModel.score`` at batch 1 and at ``max_batch``: what batching can gain on this model."""
    from escrag.formats import response_text
    from reward_server.model import RewardModel

    rm = RewardModel.load(head)
    pairs = [(it["history"], response_text(it["output"])) for it in items]
    rm.score(pairs[:2])
    t = time.perf_counter()
    for p in pairs[:max_batch // 2]:
        rm.score([p])
    one = (max_batch // 2) / (time.perf_counter() - t)
    t = time.perf_counter()
    for i in range(0, 2 * max_batch, max_batch):
        rm.score(pairs[i:i + max_batch])
    return {"batch_1_items_per_s": round(one, 2), f"batch_{max_batch}_items_per_s":
            round(2 * max_batch / (time.perf_counter() - t), 2)}


def run_reward(args, tmp: Path, loads: dict, items: list[dict]) -> tuple[dict, Path]:
    from escrag.models import resolve_auto_dtype

    dtype = resolve_auto_dtype(args.reward_dtype, "cpu")
    head = random_head(args.reward_backbone, args.reward_max_length, tmp / "head", dtype)
    server = ServerProcess("reward", ["reward", "--rm", str(head), "-o", f"reward.max_queue={args.queue}"], tmp, 600)
    try:
        out = {"backbone": args.reward_backbone, "dtype": dtype, "max_length": args.reward_max_length,
               "max_batch": load_config().reward.max_batch, "max_queue": args.queue,
               **sweep(server.url, server.proc.pid, ["reward /score", "reward /get_reward"],
                       "reward /score + /get_reward", loads, args)}
    finally:
        server.stop()
    out["inprocess"] = reward_inprocess(head, items, out["max_batch"])
    print(f"in-process RewardModel.score: {out['inprocess']}", flush=True)
    return out, head


def run_retriever_and_counselor(args, tmp: Path, loads: dict, which: set[str]) -> dict:
    cfg = load_config()
    index = get_index(argparse.Namespace(index=None, chunks=args.chunks), cfg)
    retriever = ServerProcess("retriever", ["retriever", "--index", str(index), "-o", f"retriever.max_queue={args.queue}"],
                              tmp, 600)
    out = {}
    try:
        if "retriever" in which:
            out["retriever"] = {"embedder": cfg.retriever.embedder, "chunks": args.chunks, "max_queue": args.queue,
                                "max_batch": cfg.retriever.embed_batch_size,
                                **sweep(retriever.url, retriever.proc.pid, ["retriever /retrieve"],
                                        "retriever /retrieve", loads, args)}
        if "counselor" in which:
            ccfg = load_config("configs/cpu-test.yaml")
            counselor = ServerProcess("counselor", ["counselor", "--policy", args.counselor_policy, "--retriever",
                                                    retriever.url, "--config", "configs/cpu-test.yaml"], tmp, 600)
            try:
                out["counselor"] = {"policy": args.counselor_policy, "config": "configs/cpu-test.yaml",
                                    "max_queue": ccfg.counselor.max_queue,
                                    **sweep(counselor.url, counselor.proc.pid, ["counselor /v1/chat/completions"],
                                            "counselor /v1/chat/completions", loads, args)}
            finally:
                counselor.stop()
    finally:
        retriever.stop()
    return out


# --- the fault -------------------------------------------------------------------------------------

async def fault_load(url: str, server: ServerProcess, rc, items: list[dict], args) -> dict:
    """``--long-clients`` loops of one-item ``RewardClient.score`` calls; SIGKILL at ``--kill-after``."""
    from reward_server.client import RewardClient

    client, calls, bound = RewardClient(url, rc), [], rc.wait_s + rc.timeout_s
    start = time.monotonic()
    deadline, killed = start + args.fault_seconds, {}

    async def loop(c: int):
        n = 0
        while time.monotonic() < deadline:
            n += 1
            t = time.monotonic()
            try:
                out = await asyncio.wait_for(client.score([items[(c * 997 + n) % len(items)]]), bound)
                outcome = "scored" if len(out["rewards"]) == 1 else "lost"
            except TimeoutError:
                outcome = "hung"
            except Exception as exc:  # noqa: BLE001 - a ServiceError is the answer a job sees
                outcome = f"error: {type(exc).__name__}"
            calls.append((t - start, time.monotonic() - start, outcome))

    async def kill():
        await asyncio.sleep(args.kill_after)
        killed["pid"], killed["at"] = server.proc.pid, time.monotonic() - start
        os.kill(server.proc.pid, signal.SIGKILL)

    await asyncio.gather(kill(), *(loop(c) for c in range(args.long_clients)))
    await client.aclose()
    at = killed["at"]
    spanning = [c for c in calls if c[0] <= at <= c[1]]
    after = [c[1] for c in calls if c[0] > at and c[2] == "scored"]
    return {"clients": args.long_clients, "seconds": args.fault_seconds, "killed_at_s": round(at, 1),
            "call_bound_s": bound, "episodes_submitted": len(calls),
            "outcomes": dict(Counter(c[2] for c in calls)),
            "in_flight_at_kill": len(spanning), "in_flight_outcomes": dict(Counter(c[2] for c in spanning)),
            "in_flight_longest_s": round(max((c[1] - c[0] for c in spanning), default=0), 1),
            "first_new_score_after_kill_s": round(min(after) - at, 1) if after else None}


def run_fault(args, tmp: Path, head: Path, items: list[dict]) -> dict:
    from ray_jobs.services import JobServices

    cfg = load_config(None, [f"reward.head_dir={head}", f"run.output_dir={tmp / 'run'}"])
    config_file = tmp / "job-config.yaml"
    config_file.write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    with JobServices(cfg, config_file, tmp / "job-logs", need_retriever=False, log=print) as svc:
        server = svc.started["reward"]
        out = asyncio.run(fault_load(svc.urls["reward"], server, cfg.reward, items, args))
        deadline = time.time() + cfg.run.server_timeout_s  # the calls can end before the restart does
        while svc.restarts["reward"] < 1 and time.time() < deadline:
            time.sleep(1)
        out["restarts"] = svc.restarts["reward"]
    out["lost"] = out["episodes_submitted"] - out["outcomes"].get("scored", 0) - \
        sum(n for k, n in out["outcomes"].items() if k.startswith("error"))
    print(f"fault: {out}", flush=True)
    return out


# --- the goals -------------------------------------------------------------------------------------

def goals(result: dict) -> dict:
    out = {}
    for name in ("reward", "retriever", "counselor"):
        r = result.get(name)
        if not r:
            continue
        rows = [row for lv in r["levels"].values() for row in lv.values()] + [r["long"]]
        out[name] = {"unexpected_answers": sum(row["unexpected"] for row in rows),
                     "rss_growth": r["long"]["rss_growth"], "rss_ok": r["long"]["rss_growth"] < GOAL_RSS_GROWTH}
        if name != "counselor":
            out[name]["batching"] = {wl: round(lv["32"]["ok_per_s"] / lv["1"]["ok_per_s"], 2)
                                     for wl, lv in r["levels"].items() if "1" in lv and "32" in lv}
            out[name]["batching_ok"] = all(x >= GOAL_BATCHING for x in out[name]["batching"].values())
    if "fault" in result:
        f = result["fault"]
        out["fault"] = {"hung": f["outcomes"].get("hung", 0), "lost": f["lost"], "restarts": f["restarts"]}
    return out


def machine() -> str:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor())
    flags = Path("/proc/cpuinfo").read_text()
    isa = [f for f in ("avx512_bf16", "amx_bf16", "avx512f", "avx2") if f" {f}" in flags]
    return f"{model}, {os.cpu_count()} cores, {'/'.join(isa[:1]) or 'no avx2'}"


def main(argv=None) -> int:
    args = parse_args(argv)
    args.levels = [int(x) for x in args.levels.split(",")]
    which = set(args.servers.split(","))
    items = make_items(256, 4)
    texts = queries(512)
    counsel = [it["history"][-3:] for it in items]
    loads = workloads(items, texts, counsel)
    result = {"machine": machine(), "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
              "load_avg_at_start": list(os.getloadavg()), "smoke": args.smoke,
              "config": {k: getattr(args, k) for k in ("levels", "seconds", "long_seconds", "long_clients",
                                                       "warmup_seconds", "bad_every", "queue", "timeout")}}
    print(f"{'workload':<34}{'clients':>6}{'ok/s':>10}{'p50 ms':>10}{'p99 ms':>10}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        head = None
        if which & {"reward", "fault"}:
            if "reward" in which:
                result["reward"], head = run_reward(args, tmp, loads, items)
            else:
                from escrag.models import resolve_auto_dtype

                head = random_head(args.reward_backbone, args.reward_max_length, tmp / "head",
                                   resolve_auto_dtype(args.reward_dtype, "cpu"))
        if which & {"retriever", "counselor"}:
            result.update(run_retriever_and_counselor(args, tmp, loads, which))
        if "fault" in which:
            result["fault"] = run_fault(args, tmp, head, items)
    result["load_avg_at_end"] = list(os.getloadavg())
    result["goals"] = goals(result)
    print(f"goals: {result['goals']}")
    write_json(args.out, result)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    from escrag.runtime import tune_process

    tune_process()
    sys.exit(main())
