"""Reward-server throughput: 64 concurrent one-item clients vs in-process batched scoring at batch 32.

Server: a real ``escrag serve reward --rm DIR`` process (max_batch 32) and ``--concurrency`` client
tasks, each sending one-item ``POST /score`` requests through ``RewardClient`` until all items are
scored: the server's micro-batcher must coalesce them. In-process: ``RewardModel.score`` on the same
items in chunks of ``--batch``. Rounds alternate between the two (the machine's speed drifts); the best
round of each is compared. Target: the server reaches >= 80% of the in-process throughput.

Without ``--rm`` a seeded random head is made for ``--backbone`` (throughput does not depend on the
head's weights).

Run (the lead runs the full size alone on the machine):
    .venv/bin/python bench/bench_reward_server.py                       # SmolLM2-135M, 256 items
    .venv/bin/python bench/bench_reward_server.py --backbone tiny-random:qwen2 --items 64 --rounds 1  # smoke
Writes bench/results/reward_server.json.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from escrag.atomic import write_json  # noqa: E402
from escrag.config import RewardConfig  # noqa: E402
from escrag.data import load_states  # noqa: E402
from escrag.web.procs import ServerProcess  # noqa: E402
from reward_server.client import RewardClient  # noqa: E402


def make_items(n: int, history_turns: int) -> list[dict]:
    states = load_states("valid")[:n]
    return [{"history": s.history[-history_turns:],
             "output": f"<think>Reflect feelings.</think><response>{s.target}</response>"} for s in states]


def random_head(backbone: str, max_length: int, out: Path, dtype: str = "float32") -> Path:
    import torch
    from transformers import AutoConfig

    from escrag.models import resolve_model
    from reward_server.model import backbone_fingerprint, save_head

    hidden = AutoConfig.from_pretrained(resolve_model(backbone)).hidden_size
    weight = torch.randn(hidden, generator=torch.Generator().manual_seed(0)) / hidden ** 0.5
    manifest = {"backbone": backbone, "backbone_fingerprint": backbone_fingerprint(backbone, dtype),
                "dtype": dtype, "max_length": max_length, "max_history_turns": None}
    return save_head(out, weight, 0.0, manifest)


async def server_round(url: str, items: list[dict], concurrency: int) -> float:
    client = RewardClient(url, RewardConfig(timeout_s=600, wait_s=600))
    queue = list(reversed(items))

    async def worker():
        while queue:
            await client.score([queue.pop()])

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    seconds = time.perf_counter() - start
    await client.aclose()
    return len(items) / seconds


def inprocess_round(rm, items: list[dict], batch: int) -> float:
    from escrag.formats import response_text

    pairs = [(it["history"], response_text(it["output"])) for it in items]
    start = time.perf_counter()
    for i in range(0, len(pairs), batch):
        rm.score(pairs[i:i + batch])
    return len(items) / (time.perf_counter() - start)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backbone", default="packaged:smollm2-135m-instruct")
    p.add_argument("--rm", default=None, help="trained head folder (default: a random head for --backbone)")
    p.add_argument("--items", type=int, default=256)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--batch", type=int, default=RewardConfig().max_batch)
    p.add_argument("--max-length", type=int, default=256)
    p.add_argument("--history-turns", type=int, default=4)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", default=str(ROOT / "bench/results/reward_server.json"))
    args = p.parse_args(argv)
    from reward_server.model import RewardModel

    items = make_items(args.items, args.history_turns)
    with tempfile.TemporaryDirectory() as tmp:
        head = Path(args.rm) if args.rm else random_head(args.backbone, args.max_length, Path(tmp) / "head")
        server = ServerProcess("reward", ["reward", "--rm", str(head), "-o", f"reward.max_batch={args.batch}",
                                          "-o", "reward.max_wait_ms=5"], Path(tmp), timeout=300)
        url = server.url
        try:
            rm = RewardModel.load(head)
            rm.score([(items[0]["history"], "warm up")])
            asyncio.run(server_round(url, items[:4], 4))  # warm up
            local, served = [], []
            for _ in range(args.rounds):
                local.append(inprocess_round(rm, items, args.batch))
                served.append(asyncio.run(server_round(url, items, args.concurrency)))
            import httpx

            health = httpx.get(f"{url}/health").json()
        finally:
            server.stop()
    ratio = max(served) / max(local)
    print(f"\nreward scoring throughput: {head} ({rm.manifest['backbone']}), {args.items} items, "
          f"max_length {rm.manifest['max_length']}")
    print(f"{'path':<42}{'items/s (best)':>16}{'rounds':>30}")
    print(f"{'in-process RewardModel.score, batch ' + str(args.batch):<42}{max(local):>16.1f}"
          f"{', '.join(f'{x:.1f}' for x in local):>30}")
    print(f"{f'server, {args.concurrency} one-item clients':<42}{max(served):>16.1f}"
          f"{', '.join(f'{x:.1f}' for x in served):>30}")
    mean_batch = health["items"] / max(1, health["batches"])
    print(f"server / in-process: {ratio:.0%} (target >= 80%); server mean batch {mean_batch:.1f}")
    result = {"backbone": rm.manifest["backbone"], "items": args.items, "concurrency": args.concurrency,
              "batch": args.batch, "inprocess_items_per_s": local, "server_items_per_s": served,
              "ratio": ratio, "server_mean_batch": mean_batch, "target": 0.8}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_json(args.out, result)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    from escrag.runtime import tune_process

    tune_process()
    sys.exit(main())
