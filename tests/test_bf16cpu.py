"""bfloat16 linears emulated in float32 on a CPU without bfloat16 instructions (escrag/bf16cpu.py),
on the tiny random Qwen2: with bfloat16 weights and under float32-weight autocast (forward and
gradients) it gives PyTorch's native bfloat16 numbers up to summation order; float32 is untouched;
the models the project loads get it exactly where ``fast_bfloat16("cpu")`` is False.

Run: .venv/bin/python -m pytest -q tests/test_bf16cpu.py"""

import copy

import pytest
import torch

from escrag.bf16cpu import EmulatedBF16Linear, emulate_bf16_linears
from escrag.models import fast_bfloat16, load_causal_lm

pytestmark = pytest.mark.unit

IDS = torch.tensor([[1, 504, 2088, 314, 253, 1345, 28, 940], [1, 9519, 28, 940, 446, 2, 504, 2088]])


def _pair(tiny_model, dtype):
    native = load_causal_lm(tiny_model, dtype)
    for m in native.modules():  # whatever this CPU loads, the reference is PyTorch's own linear
        if type(m) is EmulatedBF16Linear:
            m.__class__ = torch.nn.Linear
    return native, emulate_bf16_linears(copy.deepcopy(native))


def _close(a, b, scale):
    """Measured: 99.99% of the logits the very same bfloat16 value, the rest one step apart; float32
    logits against native bfloat16 ones: 34% the same (so a product not rounded as bfloat16 fails)."""
    assert a.dtype == b.dtype
    assert (a.float() - b.float()).abs().max() <= 0.01 * scale
    assert (a == b).float().mean() > 0.99


def test_bfloat16_weights_give_the_native_logits(tiny_model):
    native, emulated = _pair(tiny_model, "bfloat16")
    assert all(type(m) is not torch.nn.Linear for m in emulated.modules())
    assert emulated.state_dict().keys() == native.state_dict().keys()
    with torch.no_grad():
        want, got = native(IDS).logits, emulated(IDS).logits
    assert want.dtype == torch.bfloat16
    _close(got, want, want.float().abs().max())


def test_autocast_forward_and_gradients_match_native(tiny_model):
    native, emulated = _pair(tiny_model, "float32")
    grads = []
    for model in (native, emulated):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(IDS).logits
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].float().flatten(0, 1), IDS[:, 1:].flatten())
        loss.backward()
        grads.append((logits, loss, {n: p.grad for n, p in model.named_parameters()}))
    (l_n, loss_n, g_n), (l_e, loss_e, g_e) = grads
    _close(l_e, l_n, l_n.float().abs().max())
    assert loss_e.item() == pytest.approx(loss_n.item(), rel=1e-3)
    for name, g in g_n.items():
        assert g_e[name].dtype == g.dtype == torch.float32
        assert torch.allclose(g_e[name], g, rtol=0.05, atol=0.02 * g.abs().max().item()), name


def test_float32_is_the_plain_linear(tiny_model):
    native, emulated = _pair(tiny_model, "float32")
    with torch.no_grad():
        assert torch.equal(emulated(IDS).logits, native(IDS).logits)


def test_loaded_models_emulate_only_without_fast_bfloat16(tiny_model):
    model = load_causal_lm(tiny_model, "bfloat16")
    kinds = {type(m) for m in model.modules() if isinstance(m, torch.nn.Linear)}
    assert kinds == ({torch.nn.Linear} if fast_bfloat16("cpu") else {EmulatedBF16Linear})
