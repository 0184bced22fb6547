"""The CPU class (escrag.models.cpu_class) follows the kernels' own environment: ATEN_CPU_CAPABILITY
and ONEDNN_MAX_CPU_ISA hold torch and oneDNN to a lower instruction set, and the project's auto dtypes
and the demo's sizes (which read the class) follow them, so that `ATEN_CPU_CAPABILITY=avx2
ONEDNN_MAX_CPU_ISA=AVX2 make demo` runs the float32 AVX2 path on an AVX-512 machine.

    .venv/bin/python -m pytest -q tests/test_cpu_class.py
"""

from __future__ import annotations

from pathlib import Path

import pytest

from escrag.config import load_config
from escrag.models import CPU_CLASSES, cpu_class, fast_bfloat16, resolve_auto_dtype
from escrag.safety.backbone import conv_dtype

pytestmark = pytest.mark.unit
CONFIGS = Path(__file__).resolve().parent.parent / "configs"


def _flags() -> set[str]:
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    return set(next((ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith("flags")), []))


@pytest.fixture
def uncapped(monkeypatch):
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    return monkeypatch


def test_without_caps_the_class_is_the_flags(uncapped):
    flags = _flags()
    assert cpu_class() in CPU_CLASSES
    assert fast_bfloat16("cpu") == bool(flags & {"amx_bf16", "avx512_bf16"})
    assert (cpu_class() in ("avx512", "avx512-bf16", "amx")) == ("avx512f" in flags)


def test_avx2_caps_give_the_float32_path_on_any_cpu(uncapped):
    """Both variables as the issue sets them, and each alone: the class is at most avx2, bfloat16 is not
    fast, and the CPU demo's auto dtypes (learner, reward backbone, crisis check) resolve to float32."""
    for env in ({"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}, {"ATEN_CPU_CAPABILITY": "avx2"},
                {"ONEDNN_MAX_CPU_ISA": "AVX2"}):
        with pytest.MonkeyPatch.context() as mp:
            for k, v in env.items():
                mp.setenv(k, v)
            assert CPU_CLASSES.index(cpu_class()) <= CPU_CLASSES.index("avx2"), env
            assert not fast_bfloat16("cpu"), env
            demo = load_config(CONFIGS / "cpu-demo.yaml")
            assert (demo.policy.compute_dtype, demo.reward.compute_dtype, conv_dtype(demo.safety)) == \
                ("float32",) * 3, env
            assert resolve_auto_dtype("auto", "cpu") == "float32"


def test_a_cap_above_the_cpu_or_unknown_changes_nothing(uncapped):
    here = cpu_class()
    for env in ({"ATEN_CPU_CAPABILITY": "avx512"}, {"ONEDNN_MAX_CPU_ISA": "ALL"},
                {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX"}, {"ATEN_CPU_CAPABILITY": "bogus"}):
        with pytest.MonkeyPatch.context() as mp:
            for k, v in env.items():
                mp.setenv(k, v)
            assert cpu_class() == here, env


@pytest.mark.skipif("avx512_bf16" not in _flags(), reason="needs a CPU with AVX512-BF16")
def test_avx512_core_caps_bfloat16_but_not_avx512(uncapped):
    uncapped.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE")
    assert cpu_class() == "avx512" and not fast_bfloat16("cpu")
