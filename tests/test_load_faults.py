"""A reward server killed under load (issue 55, §3): the training job's own supervision
(``ray_jobs.services.JobServices``) restarts it, and every one of 32 concurrent ``RewardClient``
calls that were in flight, or came while it was down, ends in a score within its bound: no call hangs,
no episode is lost. Real processes: a ``--rule`` reward server (it restarts in seconds), SIGKILL.
The same measurement at full size, with the SmolLM2 reward model, is ``bench/bench_load.py``'s fault.

Run: .venv/bin/python -m pytest -q tests/test_load_faults.py"""

import asyncio
import os
import signal
import time
from pathlib import Path

import yaml

from escrag.config import load_config, to_dict
from ray_jobs.services import JobServices
from reward_server.client import RewardClient

HISTORY = [{"role": "user", "content": "I lost my job and I can't sleep."}]


async def _load(url: str, pid: int, rc, clients: int, seconds: float, kill_after: float) -> tuple[list, float]:
    client, calls, start = RewardClient(url, rc), [], time.monotonic()
    bound = rc.wait_s + rc.timeout_s

    async def loop(c: int):
        n = 0
        while time.monotonic() - start < seconds:
            n += 1
            t = time.monotonic() - start
            try:
                out = await asyncio.wait_for(client.score([{"history": HISTORY, "output": f"ok {c} {n}"}]), bound)
                outcome = "scored" if len(out["rewards"]) == 1 else "lost"
            except TimeoutError:
                outcome = "hung"
            calls.append((t, time.monotonic() - start, outcome))

    async def kill():
        await asyncio.sleep(kill_after)
        os.kill(pid, signal.SIGKILL)
        return time.monotonic() - start

    killed_at, *_ = await asyncio.gather(kill(), *(loop(c) for c in range(clients)))
    await client.aclose()
    return calls, killed_at


def test_a_killed_reward_server_under_32_clients_loses_no_call(tmp_path):
    cfg = load_config(None, ["reward.rule=vowels", f"run.output_dir={tmp_path}", "run.supervise_s=0.2",
                             "reward.timeout_s=5", "reward.wait_s=40", "reward.backoff_s=0.2"])
    config_file = tmp_path / "config.yaml"
    config_file.write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    with JobServices(cfg, config_file, Path(tmp_path / "logs"), need_retriever=False, log=lambda m: None) as svc:
        pid = svc.started["reward"].proc.pid
        calls, killed_at = asyncio.run(_load(svc.urls["reward"], pid, cfg.reward, 32, 8.0, 2.0))
        assert svc.restarts["reward"] == 1 and svc.started["reward"].proc.pid != pid
    in_flight = [c for c in calls if c[0] <= killed_at <= c[1]]
    assert len(in_flight) >= 16, "the kill found too few calls in flight to test anything"
    assert {c[2] for c in calls} == {"scored"}, [c for c in calls if c[2] != "scored"]
    assert max(end - begin for begin, end, _ in calls) < cfg.reward.wait_s
    assert any(begin > killed_at + 1 for begin, _, _ in calls), "no call was scored by the restarted server"
