"""The crisis check's conversation backbone on a GPU (``safety.conv_device``): the same pooled states
as on the CPU (bfloat16 autocast on both, so within bfloat16 rounding), returned as CPU arrays, and
``RiskClassifier.from_config`` puts it where the config says. Skips itself without CUDA.
Run (on a GPU machine): .venv/bin/python -m pytest -q tests/gpu/test_safety_backbone.py"""

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

CONVS = [[{"role": "user", "content": "I have the pills counted out and I wrote the letters"}],
         [{"role": "user", "content": "exams are killing me"}, {"role": "assistant", "content": "That sounds hard."},
          {"role": "user", "content": "it is fine, just tired"}]]


def test_gpu_backbone_gives_the_cpu_states():
    from escrag.safety.backbone import Backbone

    cpu, gpu = (Backbone("tiny-random:llama", [1, 2], batch=4, device=d) for d in ("cpu", "cuda"))
    assert next(gpu.lm.parameters()).is_cuda
    a, b = cpu.features(CONVS), gpu.features(CONVS)
    assert isinstance(b, np.ndarray) and b.shape == a.shape
    np.testing.assert_allclose(b, a, rtol=0.05, atol=0.05)


def test_config_places_the_backbone():
    from escrag.config import load_config
    from escrag.safety.classifier import RiskClassifier

    cfg = load_config("configs/cpu-test.yaml", ["safety.head=false", "safety.conv_device=cuda"])
    clf = RiskClassifier.from_config(cfg)
    assert next(clf.backbone.lm.parameters()).is_cuda and clf.assess(CONVS[0]).level in ("high", "elevated", "none")
