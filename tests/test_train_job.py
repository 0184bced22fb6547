"""The GRPO training job (ray_jobs/train_grpo.py) end to end on the tiny random Qwen2, against a real
reward server process (``vowels`` rule) and the session Ray head:

- ``ray job submit --working-dir .`` of ``python -m ray_jobs.train_grpo --config configs/cpu-test.yaml``
  succeeds and writes metrics, a checkpoint, the merged policy and the plot;
- resume: the job is killed (SIGKILL) right after a checkpoint, ``--resume`` continues from that
  checkpoint's step, and every step's data position equals that of an uninterrupted run, with an
  epoch boundary crossed after the resume; the metrics log holds each step exactly once.

Vanilla rollouts (``rollout.rag: false``) keep it cheap; the two-stage path runs in the demo.
Run: .venv/bin/python -m pytest -q tests/test_train_job.py   (~150 s on 2 shared cores, ~70 s CPU)"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from trainer.checkpoint import StateSampler
from trainer.metrics import read_metrics

ROOT = Path(__file__).resolve().parent.parent
EXCLUDES = [".venv", ".cache", "runs", ".git", "bench/.cache", "**/__pycache__", ".pytest_cache"]


def _overrides(out: Path, reward_url: str, steps: int) -> list[str]:
    items = [f"run.output_dir={out}", f"reward.url={reward_url}", "rollout.rag=false", f"grpo.steps={steps}",
             "grpo.checkpoint_every=1", "data.max_history_turns=1", "data.max_train_states=5",
             "grpo.batch_states=2", "rollout.max_new_tokens_stage1=8", "rollout.torch_threads=1"]
    return [arg for item in items for arg in ("-o", item)]


def _job(out: Path, reward_url: str, steps: int) -> list[str]:
    return [sys.executable, "-m", "ray_jobs.train_grpo", "--config", "configs/cpu-test.yaml",
            *_overrides(out, reward_url, steps)]


def test_ray_job_submit(ray_session, serve, tmp_path):
    reward_url = serve(["reward", "--rule", "vowels"])
    out = tmp_path / "run"
    env = {k: os.environ[k] for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "TOKENIZERS_PARALLELISM",
                                      "ESCRAG_CACHE", "HOME") if k in os.environ}
    runtime_env = {"excludes": EXCLUDES, "env_vars": env}
    cmd = [str(Path(sys.executable).parent / "ray"), "job", "submit", "--address", ray_session.dashboard_url,
           "--working-dir", ".", "--runtime-env-json", json.dumps(runtime_env), "--", *_job(out, reward_url, 2)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=400)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "succeeded" in text, f"{proc.stdout[-3000:]}\n--- stderr:\n{proc.stderr[-1500:]}"
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    assert all(0.0 <= r["reward_mean"] <= 2.0 and r["groups"] == 2 for r in rows)
    assert (out / "checkpoints" / "latest").read_text().strip() == "step-000002"
    assert (out / "policy" / "model.safetensors").is_file() and (out / "reward_curve.png").is_file()


def _wait_for_checkpoint(proc, latest: Path, log: Path, min_step: int, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if latest.is_file() and int(latest.read_text().strip().split("-")[1]) >= min_step:
            return
        assert proc.poll() is None, f"job exited early:\n{log.read_text()[-4000:]}"
        time.sleep(0.1)
    raise AssertionError(f"no checkpoint >= {min_step} after {timeout} s:\n{log.read_text()[-4000:]}")


def test_kill_and_resume_continue_exactly(ray_session, serve, tmp_path):
    reward_url = serve(["reward", "--rule", "vowels"])
    out, steps, log = tmp_path / "run", 6, tmp_path / "job.log"
    cmd = _job(out, reward_url, steps) + ["-o", f"ray.address={ray_session.address}"]
    with log.open("w") as fh:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT)
    try:
        _wait_for_checkpoint(proc, out / "checkpoints" / "latest", log, min_step=2)
    finally:
        proc.kill()
        proc.wait()
    killed_at = int((out / "checkpoints" / "latest").read_text().strip().split("-")[1])
    assert killed_at < steps, "the job finished before it could be killed"
    resumed = subprocess.run(cmd + ["--resume"], cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert f"resumed from step {killed_at}" in resumed.stdout
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    fresh = StateSampler(5, 2, seed=0)  # the uninterrupted run's data positions
    for r in rows:
        fresh.next_batch()
        assert (r["epoch"], r["data_index"]) == (fresh.epoch, fresh.index), r["step"]
    assert rows[-1]["epoch"] >= 2  # epoch boundaries crossed after the resume too
    state = json.loads((out / "checkpoints" / f"step-{steps:06d}" / "state.json").read_text())
    assert state["step"] == steps and state["sampler"] == fresh.state_dict()
    assert state["version"] == rows[-1]["version"]
