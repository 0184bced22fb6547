"""A demo that knows where it is (issue 54, §4): `make demo`'s first line names the CPU class detected
here, the dtypes it chose, the sizes that class runs (configs/cpu-demo-classes.yaml) and the time a
fresh-clone demo took on that class (bench/results/wall_times.json); after the first timed stage a
machine slower than that by more than 1.5x is told so, once. The AVX2 class is reached on any machine
through ATEN_CPU_CAPABILITY / ONEDNN_MAX_CPU_ISA.

    .venv/bin/python -m pytest -q tests/test_demo_note.py
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from escrag.config import load_config
from escrag.models import FAST_BF16_CLASSES
from ray_jobs.demo import class_sizes, compute_note, demo_overrides, expected_run, pace_check

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parent.parent
AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}


@pytest.fixture
def avx2(monkeypatch):
    for k, v in AVX2.items():
        monkeypatch.setenv(k, v)


def test_the_note_names_class_dtypes_sizes_and_the_class_time(avx2):
    overrides = demo_overrides("configs/cpu-demo.yaml", None)
    assert overrides and all("=" in o for o in overrides)  # the float32 classes run smaller sizes
    cfg = load_config("configs/cpu-demo.yaml", overrides)
    assert cfg.grpo.steps == class_sizes("avx2")["grpo.steps"] < load_config("configs/cpu-demo.yaml").grpo.steps
    note = compute_note(cfg)
    run = expected_run("avx2")
    assert note.startswith("CPU class avx2 (ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2)")
    assert "learner float32, rollout engine float32, reward backbone float32, crisis check float32" in note
    assert f"grpo.steps={cfg.grpo.steps}" in note
    assert f"expect ~{round(run['seconds'] / 60)} minutes" in note and run["machine"] in note


def test_sizes_apply_to_the_demo_config_only(avx2):
    assert demo_overrides("configs/cpu-test.yaml", None) == []
    assert demo_overrides("configs/cpu-test.yaml", "configs/cpu-demo-classes.yaml") == \
        demo_overrides(str(ROOT / "configs" / "cpu-demo.yaml"), None)


def test_the_bfloat16_classes_run_the_config_sizes_and_every_class_is_listed():
    import yaml

    from escrag.models import CPU_CLASSES

    table = yaml.safe_load((ROOT / "configs" / "cpu-demo-classes.yaml").read_text())
    assert set(table) == set(CPU_CLASSES)
    assert all(set(class_sizes(c)) == {"safety.rollout_metric_samples"} for c in FAST_BF16_CLASSES)
    for cpu in CPU_CLASSES:  # every size is a key the config takes
        load_config("configs/cpu-demo.yaml", [f"{k}={v}" for k, v in class_sizes(cpu).items()])


def test_a_slow_machine_is_told_once_after_the_first_timed_stage():
    run = {"seconds": 600, "machine": "the table's machine", "stages_s": {"pairs": 2, "index": 40, "rm": 40}}
    said = []
    check = pace_check(run, said.append)
    check("pairs", {"seconds": 9.0})  # under 10 s in the table: start-up, not compared
    check("index", {"seconds": 80.0})
    check("rm", {"seconds": 400.0})
    assert len(said) == 1 and "index took 80 s against 40 s" in said[0] and "~20 minutes rather than ~10" in said[0]
    quiet = []
    check = pace_check(run, quiet.append)
    check("index", {"seconds": 59.0})  # 1.48x: within the table's pace
    check("rm", {"seconds": 400.0})  # only the first timed stage is compared
    assert quiet == []
    pace_check(None, quiet.append)("index", {"seconds": 1e6})
    assert quiet == []


def test_make_demo_prints_the_note_first(tmp_path):
    """The real entry point under the AVX2 caps: its first line is the note (the process is stopped there)."""
    env = {**os.environ, **AVX2}
    proc = subprocess.Popen([sys.executable, "-m", "ray_jobs.demo", "--config", "configs/cpu-demo.yaml",
                             "-o", f"run.output_dir={tmp_path}"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        first = proc.stdout.readline()
    finally:
        proc.kill()
        proc.wait()
    assert first.startswith("CPU class avx2 (") and "learner float32" in first and "grpo.steps=" in first
