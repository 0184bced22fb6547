"""The GPU check (tests/gpu/device_check.sh and .py) keeps working where no GPU is: the shell script,
run here, finds no CUDA and runs every part at tiny shapes on the CPU: the CPU-vs-device agreement
(both sides the CPU: exact), the learner sweep with and without checkpointing beside the placement
plan's estimate, the engine's prefill and decode rates, the reward backbone in bfloat16 and float32,
with a progress line per part and every thread's stack printed when a part runs long; it exits 0
only when every part passed, and non-zero, with the part named in the JSON, when one raised or ran out
of memory (made to, here, by DEVICE_CHECK_FAIL / DEVICE_CHECK_OOM), the out-of-memory recorded;
its sweeps are sized from the card's memory, so an H100 and an H200 each get what they hold.
It loads no Ray, server, FAISS, vLLM, DeepSpeed or OpenRLHF code, and what it needs on the GPU machine
(the working tree and the tiny model folder) fits the 64 MiB that travels there.
Run: .venv/bin/python -m pytest -q tests/test_device_check.py   (~35 s)"""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN = {"ray", "fastapi", "starlette", "uvicorn", "faiss", "vllm", "deepspeed", "openrlhf", "sentence_transformers"}


def test_the_gpu_check_runs_on_the_cpu(tmp_path, tiny_model):
    env = {**os.environ, "PYTHON": sys.executable, "TINY": tiny_model, "PART_TIMEOUT_S": "1"}
    res = subprocess.run(["bash", "tests/gpu/device_check.sh", str(tmp_path)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    for part in ("agreement", "learner", "engine", "reward"):  # progress, where the run is unattended
        assert f"[device-check] {part}: start at" in res.stdout and f"[device-check] {part}: done in" in res.stdout
    # a part past PART_TIMEOUT_S prints where every thread is (the agreement builds 4 models: > 1 s)
    assert "[device-check] agreement: still running after 1 s; stacks:" in res.stdout, res.stdout[-3000:]
    assert 'device_check.py", line' in res.stdout.split("still running after 1 s")[1]
    out = json.loads((tmp_path / "device_check.json").read_text())
    assert out["mode"] == "cpu" and not any("error" in out[p] or "skipped" in out[p]
                                            for p in ("agreement", "learner", "engine", "reward")), out
    assert out["failed"] == [] and "[device-check] every part passed" in res.stdout
    a = out["agreement"]
    assert a["logprobs_within_1e-4"] and a["greedy_tokens_equal"] and a["step_loss_abs_diff"] == 0.0
    assert a["step_kl"][0] > 0 and a["step_loss"][0] != 0  # the compared step is not a trivial one
    runs = out["learner"]["runs"]
    assert [(r["seq"], r["checkpointing"]) for r in runs] == [(64, False), (64, True), (128, False), (128, True)]
    assert all(r["tokens_per_s"] > 0 and r["estimate_gb"] > 0 and r["micro_batch"] == 2 for r in runs)
    assert out["engine"]["prefill_tokens_per_s"] > 0 and out["engine"]["decode_tokens"] > 0
    assert out["reward"]["bfloat16"]["items_per_s"] > 0 and out["reward"]["float32"]["items_per_s"] > 0
    assert not FORBIDDEN & set(out["third_party_modules"]), out["third_party_modules"]
    assert {"torch", "transformers", "pydantic"} <= set(out["third_party_modules"])


def test_what_travels_fits_the_upload(tiny_model):
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.split("\n")
    tree = sum((ROOT / f).stat().st_size for f in files if f and (ROOT / f).is_file())
    model = sum(p.stat().st_size for p in Path(tiny_model).rglob("*") if p.is_file())
    assert tree + model < 48 * 2**20, (tree, model)  # 64 MiB with room for the carried wheels (~3 MiB)


def test_a_failed_part_exits_non_zero_and_an_oom_is_a_result(tmp_path, tiny_model):
    env = {**os.environ, "DEVICE_CHECK_FAIL": "agreement", "DEVICE_CHECK_OOM": "reward"}
    res = subprocess.run([sys.executable, "tests/gpu/device_check.py", "--out", str(tmp_path), "--cpu",
                          "--tiny", tiny_model, "--only", "agreement,reward"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    assert "Traceback" not in res.stderr and "[device-check] FAILED: agreement, reward" in res.stdout
    out = json.loads((tmp_path / "device_check.json").read_text())
    assert out["failed"] == ["agreement", "reward"]
    assert out["agreement"]["error"].startswith("RuntimeError: DEVICE_CHECK_FAIL=agreement")
    assert out["reward"]["oom"] is True and "OutOfMemoryError" in out["reward"]["error"]
    assert "learner" not in out and "engine" not in out  # --only: the others were not asked for


def test_the_sweeps_follow_the_card():
    sys.path.insert(0, str(ROOT / "tests" / "gpu"))
    import device_check as dc

    from escrag.shapes import KNOWN

    policy, rm = KNOWN["Qwen/Qwen2.5-3B-Instruct"], KNOWN["Qwen/Qwen2.5-7B"]
    h100, h200, small = (dc.gpu_sizes(gb, policy, rm, 512) for gb in (79.2, 139.8, 40.0))
    assert h100["seqs"] == h200["seqs"] == dc.GPU_SEQS and h100["rm"] == h200["rm"] == (8, 4096)
    assert small["seqs"] == dc.GPU_SEQS[:1] and small["rm"][0] < 8  # a card that holds less runs less
