"""The GRPO training job (ray_jobs/train_grpo.py) end to end on the tiny random Qwen2, against a real
reward server process (``vowels`` rule) and the session Ray head:

- ``ray job submit --working-dir .`` of ``python -m ray_jobs.train_grpo --config configs/cpu-test.yaml``
  succeeds and writes metrics, a checkpoint, the merged policy and the plot;
- resume: the job is killed (SIGKILL) right after a checkpoint, ``--resume`` continues from that
  checkpoint's step, and every step's data position equals that of an uninterrupted run, with an
  epoch boundary crossed after the resume; the metrics log holds each step exactly once, and every
  sampled output equals the uninterrupted run's (seeds are derived per step and state);
- resume with ``grpo.max_staleness: 1``: killed the same way while the next step's rollouts were in
  flight, the job resumes at the checkpoint's step and data position, draws that in-flight batch
  again with the checkpoint's weights (its groups are not behind the learner) and trains every later
  step on groups exactly one version behind, each step once, nothing dropped;
- services: a retriever and a reward server the job started (with ``ESCRAG_API_KEY`` set, so the workers
  must send it) are killed with SIGKILL mid-run, one after step 1, the other after step 2; the job restarts
  them, finishes every step with every group once, and its metrics count both restarts; a reward server the job was
  only given goes away, and the job stops with exit 1, a one-line message naming the URL, and a
  checkpoint at the last finished step;
- held-out validation (``grpo.eval_every``): the same seeded valid-split states after every step through
  the two-stage path, logged under ``eval/`` (metrics.jsonl and TensorBoard), disjoint from training.

Vanilla rollouts (``rollout.rag: false``) keep it cheap; the two-stage path runs in the demo.
Run: .venv/bin/python -m pytest -q tests/test_train_job.py   (~150 s on 2 shared cores, ~70 s CPU)"""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from escrag.web.procs import ServerProcess
from trainer.metrics import read_metrics
from trainer.sampler import StateSampler

ROOT = Path(__file__).resolve().parent.parent
EXCLUDES = [".venv", ".cache", "runs", ".git", "bench/.cache", "**/__pycache__", ".pytest_cache"]


def _overrides(out: Path, reward_url: str | None, steps: int) -> list[str]:
    """A small vanilla-GRPO job; without ``reward_url`` the job serves the ``vowels`` rule itself."""
    reward = f"reward.url={reward_url}" if reward_url else "reward.rule=vowels"
    items = [f"run.output_dir={out}", reward, "rollout.rag=false", f"grpo.steps={steps}",
             "grpo.checkpoint_every=1", "data.max_history_turns=1", "data.max_train_states=5",
             "grpo.batch_states=2", "rollout.max_new_tokens_stage1=8", "rollout.torch_threads=1"]
    return [arg for item in items for arg in ("-o", item)]


def _job(out: Path, reward_url: str | None, steps: int) -> list[str]:
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
    # where gen_s went: each part of the slowest group, none longer than the worker call (one stage: vanilla)
    assert all(0.0 < r[k] <= r["gen_s"] for r in rows for k in ("stage1_s", "reward_s"))
    assert not any("stage2_s" in r or "risk_s" in r for r in rows)
    assert (out / "checkpoints" / "latest").read_text().strip() == "step-000002"
    assert (out / "policy" / "model.safetensors").is_file() and (out / "reward_curve.png").is_file()


def _kill_then_resume(cmd: list[str], out: Path, log: Path, steps: int) -> tuple[int, list[dict]]:
    """Kill the job once it has checkpointed step 2 or later, rerun it with --resume; returns the
    step it was killed at and the metrics rows of the finished run."""
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
    return killed_at, read_metrics(out / "metrics.jsonl")


def _wait_for_checkpoint(proc, latest: Path, log: Path, min_step: int, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if latest.is_file() and int(latest.read_text().strip().split("-")[1]) >= min_step:
            return
        assert proc.poll() is None, f"job exited early:\n{log.read_text()[-4000:]}"
        time.sleep(0.1)
    raise AssertionError(f"no checkpoint >= {min_step} after {timeout} s:\n{log.read_text()[-4000:]}")


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_kill_and_resume_continue_exactly(ray_session, serve, tmp_path):
    reward_url = serve(["reward", "--rule", "vowels"])
    out, steps, log = tmp_path / "run", 6, tmp_path / "job.log"
    cmd = _job(out, reward_url, steps) + ["-o", f"ray.address={ray_session.address}"]
    with (tmp_path / "straight.log").open("w") as fh:  # the uninterrupted run, beside the killed one
        straight = subprocess.Popen(_job(tmp_path / "straight", reward_url, steps) + ["-o", f"ray.address={ray_session.address}"],
                                    cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT)
    try:
        killed_at, rows = _kill_then_resume(cmd, out, log, steps)
        assert straight.wait(400) == 0, (tmp_path / "straight.log").read_text()[-3000:]
    finally:
        if straight.poll() is None:
            straight.kill()
            straight.wait()
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    fresh = StateSampler(5, 2, seed=0)  # the uninterrupted run's data positions
    for r in rows:
        fresh.next_batch()
        assert (r["epoch"], r["data_index"]) == (fresh.epoch, fresh.index), r["step"]
    assert rows[-1]["epoch"] >= 2  # epoch boundaries crossed after the resume too
    state = json.loads((out / "checkpoints" / f"step-{steps:06d}" / "state.json").read_text())
    assert state["step"] == steps and state["sampler"] == fresh.state_dict()
    assert state["version"] == rows[-1]["version"]
    resumed_samples, straight_samples = _rows(out / "samples.jsonl"), _rows(tmp_path / "straight" / "samples.jsonl")
    assert [r["step"] for r in resumed_samples] == [r["step"] for r in straight_samples] == [
        s for s in range(1, steps + 1) for _ in range(2)]
    assert resumed_samples == straight_samples  # the resumed run drew exactly what the uninterrupted one did


def test_kill_and_resume_with_max_staleness_1(ray_session, serve, tmp_path):
    reward_url = serve(["reward", "--rule", "vowels"])
    out, steps, log = tmp_path / "run", 6, tmp_path / "job.log"
    cmd = _job(out, reward_url, steps) + ["-o", f"ray.address={ray_session.address}", "-o", "grpo.max_staleness=1"]
    killed_at, rows = _kill_then_resume(cmd, out, log, steps)
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    fresh = StateSampler(5, 2, seed=0)
    for r in rows:
        fresh.next_batch()
        assert (r["epoch"], r["data_index"]) == (fresh.epoch, fresh.index), r["step"]
    lags = [r["staleness_max"] for r in rows]
    assert lags == [0 if s in (1, killed_at + 1) else 1 for s in range(1, steps + 1)], (killed_at, lags)
    assert all(r["stale_groups"] == 0 for r in rows)
    samples = _rows(out / "samples.jsonl")
    assert [r["step"] for r in samples] == [s for s in range(1, steps + 1) for _ in range(2)]
    assert [r["version"] for r in samples if r["step"] == killed_at + 1] == [rows[killed_at - 1]["version"]] * 2


def _started_pid(log: Path, name: str, timeout: float = 300) -> int:
    deadline = time.time() + timeout
    while time.time() < deadline:
        m = re.search(rf"\[job\] {name} server up at \S+ \(pid (\d+)\)", log.read_text())
        if m:
            return int(m.group(1))
        time.sleep(0.1)
    raise AssertionError(f"no {name} server started:\n{log.read_text()[-3000:]}")


def _wait_rows(out: Path, n: int, proc, log: Path, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if (out / "metrics.jsonl").is_file() and len(read_metrics(out / "metrics.jsonl")) >= n:
            return
        assert proc.poll() is None, f"job exited early:\n{log.read_text()[-4000:]}"
        time.sleep(0.1)
    raise AssertionError(f"fewer than {n} steps after {timeout} s:\n{log.read_text()[-4000:]}")


def test_job_restarts_killed_servers_and_sends_the_api_key(ray_session, tmp_path, esconv_index):
    """A 4-step two-stage job that starts its own retriever and reward server, with ``ESCRAG_API_KEY``
    set (so the servers require it and the workers must send it): the retriever is killed (SIGKILL)
    after step 1 and the reward server after step 2; the job restarts each and finishes every step
    with every group once. One job for both kills: each job here is ~30 s of a 2-core CI run."""
    out, log = tmp_path / "run", tmp_path / "job.log"
    extra = ["rollout.rag=true", f"retriever.index_dir={esconv_index}", "retriever.k=2"]
    cmd = _job(out, None, 4) + ["-o", f"ray.address={ray_session.address}", *[a for e in extra for a in ("-o", e)]]
    with log.open("w") as fh:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT,
                                env={**os.environ, "ESCRAG_API_KEY": "job-secret"})
    try:
        pids = {name: _started_pid(log, name) for name in ("retriever", "reward")}
        for step, name in enumerate(("retriever", "reward"), start=1):
            _wait_rows(out, step, proc, log)
            os.kill(pids[name], signal.SIGKILL)
        assert proc.wait(400) == 0, log.read_text()[-4000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    for name, pid in pids.items():
        assert f"[job] {name} server (pid {pid}) exited" in text and f"{name} server back at" in text
    assert text.index("[job] starting reward server") < text.index("[job] retriever server up at")  # both launched first
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and all(r["groups"] == 2 for r in rows)
    assert rows[-1]["restarts_retriever"] >= 1 and rows[-1]["restarts_reward"] >= 1
    assert all(0.0 <= r["reward_mean"] <= 2.0 and 0.0 <= r["stage1_format_mean"] <= 1.0 for r in rows)
    assert all(0.0 < r[k] <= r["gen_s"] for r in rows for k in ("stage1_s", "retrieve_s", "stage2_s", "reward_s"))


def test_job_stops_cleanly_when_a_given_service_stays_down(ray_session, tmp_path):
    server = ServerProcess("reward", ["reward", "--rule", "vowels"], tmp_path)
    out, log = tmp_path / "run", tmp_path / "job.log"
    cmd = _job(out, server.url, 20) + ["-o", f"ray.address={ray_session.address}", "-o", "reward.wait_s=3",
                                       "-o", "grpo.checkpoint_every=100"]
    with log.open("w") as fh:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT)
    try:
        _wait_rows(out, 2, proc, log)
        server.stop()
        assert proc.wait(300) == 1, log.read_text()[-4000:]
    finally:
        server.stop()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    last = log.read_text().strip().splitlines()[-1]
    assert last.startswith("train_grpo: error: POST ") and f"{server.url}/score failed" in last and "--resume" in last
    done = len(read_metrics(out / "metrics.jsonl"))
    state = json.loads((out / "checkpoints" / (out / "checkpoints" / "latest").read_text().strip() / "state.json").read_text())
    assert state["step"] == done >= 2


def test_validation_on_held_out_states(ray_session, tmp_path, esconv_index):
    """``grpo.eval_every``: after every step the job answers the same seeded valid-split states through
    the two-stage path (the job's own retriever and reward servers) and logs mean reward, its format
    and RM parts, the stage-1 format rate and the crisis check's risk shares under ``eval/`` in
    metrics.jsonl and TensorBoard; none of those states is a training state or shares a dialogue with one.
    The job also leaves its placement plan (on this CPU cluster: every consumer on the CPU)."""
    from escrag.config import load_config
    from escrag.data import load_states
    from trainer.loop import eval_states

    out = tmp_path / "run"
    extra = ["rollout.rag=true", f"retriever.index_dir={esconv_index}", "retriever.k=2", "rollout.max_new_tokens_stage2=8",
             "grpo.eval_every=1", "grpo.eval_states=3", "safety.rollout_metric=true", "safety.backbone=null"]
    cmd = _job(out, None, 2) + ["-o", f"ray.address={ray_session.address}", *[a for e in extra for a in ("-o", e)]]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert res.returncode == 0, res.stderr[-4000:]
    rows = read_metrics(out / "metrics.jsonl")
    keys = {"eval/reward_mean", "eval/format_mean", "eval/rm_mean", "eval/stage1_format_mean",
            "eval/risk_high_frac", "eval/risk_elevated_frac"}
    assert [r["step"] for r in rows] == [1, 2] and all(keys <= r.keys() for r in rows)
    assert all(r["eval/states"] == 3 and r["eval/version"] == r["version"] for r in rows)
    assert all(0.0 <= r["eval/format_mean"] <= 1.0 and 0.0 <= r["eval/risk_high_frac"] <= 1.0 for r in rows)
    assert res.stdout.count("[eval] step") == 2
    cfg = load_config("configs/cpu-test.yaml", extra)
    held = eval_states(cfg)
    assert [s.state_id for s in held] == [s.state_id for s in eval_states(cfg)] and len(held) == 3
    train = load_states(cfg.data.train)
    assert {s.dialogue_id for s in held}.isdisjoint({s.dialogue_id for s in train})
    assert {json.dumps(s.history) for s in held}.isdisjoint({json.dumps(s.history) for s in train})
    trained = {r["state_id"] for r in _rows(out / "samples.jsonl")}
    assert trained and trained.isdisjoint({s.state_id for s in held})
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags = EventAccumulator(str(out / "tensorboard")).Reload().Tags()["scalars"]
    assert {"eval/reward_mean", "eval/risk_high_frac", "train/reward_mean"} <= set(tags)
    plan = json.loads((out / "placement.json").read_text())
    assert plan["fits"] and plan["gpus"] == [] and {"learner", "worker:0", "embedder"} <= set(plan["cpu"])


def test_running_mean_of_the_reward_curve_is_trailing():
    from trainer.metrics import running_mean

    assert running_mean([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]
    assert running_mean([2.0, 4.0], 8) == [2.0, 3.0]


def test_sigterm_stops_the_servers_a_job_started(tmp_path):
    """A job ended with SIGTERM (``timeout``, a scheduler, ``ray job stop``) runs its cleanup as on Ctrl-C:
    the servers it started are stopped, not left running, and it exits 143 (``escrag.errors.run_main``)."""
    code = ("import sys, time; from pathlib import Path; from escrag.config import load_config; "
            "from escrag.errors import run_main; from ray_jobs.services import JobServices\n"
            f"cfg = load_config('configs/cpu-test.yaml', ['reward.rule=vowels', 'run.output_dir={tmp_path}'])\n"
            "def job():\n"
            f"    with JobServices(cfg, Path('{tmp_path}/c.yaml'), Path('{tmp_path}/logs'), need_retriever=False, "
            "log=lambda m: print(m, flush=True)):\n"
            "        time.sleep(600)\n"
            "sys.exit(run_main('job', job))\n")
    (tmp_path / "c.yaml").write_text("reward:\n  rule: vowels\n")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        line = ""
        while "server up at" not in line:
            line = proc.stdout.readline()
            assert line or proc.poll() is None, proc.stderr.read()[-3000:]
        server_pid = int(re.search(r"\(pid (\d+)", line).group(1))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 143, proc.stderr.read()[-3000:]
        deadline = time.time() + 30
        while time.time() < deadline and _alive(server_pid):
            time.sleep(0.2)
        assert not _alive(server_pid), "the reward server outlived the job"
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_signal_while_the_watcher_starts_still_stops_the_servers(tmp_path, monkeypatch):
    """SIGTERM can land while ``threading.Thread.start`` waits for the watcher to run (CI saw it): the
    job's ``Terminated`` must reach ``run_main`` (exit 143), not a RuntimeError from joining a thread
    that never started, and the server it started is stopped."""
    import threading

    from escrag.config import load_config
    from escrag.errors import Terminated
    from ray_jobs import services

    class SignalledThread(threading.Thread):
        def start(self):  # the handler raises in the main thread before the thread ran
            raise Terminated

    monkeypatch.setattr(services.threading, "Thread", SignalledThread)
    cfg = load_config("configs/cpu-test.yaml", ["reward.rule=vowels", f"run.output_dir={tmp_path}"])
    (tmp_path / "c.yaml").write_text("reward:\n  rule: vowels\n")
    job = services.JobServices(cfg, tmp_path / "c.yaml", tmp_path / "logs", need_retriever=False, log=lambda m: None)
    try:
        with job:
            pass
    except Terminated:
        pass
    server = job.started["reward"]
    try:
        assert not server.alive() and server.proc.poll() is not None
    finally:
        server.stop()  # the test's own cleanup, when the job left it running


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
