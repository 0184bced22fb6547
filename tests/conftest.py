"""Shared fixtures: offline HF env, the tiny random model, one Ray session for the whole test run.

Ray is started at most once per test session (``ray_session``), on 127.0.0.1 with usage stats and the
dashboard off and its temp folder inside the project; it is shut down at the end of the session.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def tiny_model() -> str:
    """Path of the seeded tiny random Qwen2 (hidden 64, 2 layers, SmolLM2 tokenizer)."""
    from escrag.models import resolve_model

    return resolve_model("tiny-random:qwen2")


@pytest.fixture(scope="session")
def tokenizer(tiny_model):
    from escrag.models import load_tokenizer

    return load_tokenizer(tiny_model)


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray for the whole session, loopback only."""
    import ray

    from escrag.raylocal import init_ray

    init_ray(num_cpus=2, tmpdir=str(ROOT / ".cache" / "ray"))
    yield ray
    ray.shutdown()
