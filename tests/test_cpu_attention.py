"""The native attention kernels (rollout/engines/cpu_attention.py), built with this machine's compiler:

- decode equals SDPA over each row's own positions in float32 and bfloat16, for SmolLM2's shape
  (head_dim 64, 3 query heads a K/V head) and two others, and never reads past a row's length (NaN
  there would spread); compiled as the torch op, it returns what the plain call returns;
- prefill (packed tokens of rows with and without a cached prefix, runs longer than the kernel's
  block) equals causal SDPA row by row;
- the eager decode step's layer kernels: rotary embedding + cache writes + decode attention from the
  fused projection equal the torch ops they replace (the cache bitwise in bfloat16); the norm and the
  activation's product equal HF's;
- loading its library leaves the process's floating-point mode alone (a library linked with
  ``-ffast-math`` turns on flush-to-zero for the whole process);
- without a compiler the engine keeps SDPA and still decodes what HF's forward gives.
The engine's passes through the kernels are checked against HF in tests/test_engine_continuous.py.
Run: .venv/bin/python -m pytest -q tests/test_cpu_attention.py"""

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from escrag.config import load_config
from rollout.engines import cpu_attention
from rollout.engines.base import SamplingParams
from rollout.engines.decoder import _rope
from rollout.engines.hf_engine import HFEngine

LENS = [1, 17, 48, 30]  # row r attends positions [0, LENS[r]) of slot r


def _reference(q, k_cache, v_cache, lens, scale):
    n, heads, head_dim = q.shape
    kv_heads = k_cache.shape[1]
    rows = []
    for r in range(n):
        k, v = k_cache[r, :, :lens[r]].float(), v_cache[r, :, :lens[r]].float()
        qr = q[r].float().view(kv_heads, heads // kv_heads, head_dim)
        rows.append(F.scaled_dot_product_attention(qr, k, v, scale=scale).reshape(heads, head_dim))
    return torch.stack(rows)


def _case(dtype, head_dim, heads, kv_heads):
    g = torch.Generator().manual_seed(head_dim + heads)
    k_cache, v_cache = (torch.randn(len(LENS) + 2, kv_heads, 64, head_dim, generator=g) for _ in range(2))
    for r, n in enumerate(LENS):  # past a row's length: NaN, which would reach the output if read
        k_cache[r, :, n:] = float("nan")
        v_cache[r, :, n:] = float("nan")
    q = torch.randn(len(LENS), heads, head_dim, generator=g)
    return q.to(dtype), k_cache.to(dtype), v_cache.to(dtype), torch.tensor(LENS)


@pytest.mark.parametrize("dtype,atol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("head_dim,heads,kv_heads", [(64, 9, 3), (16, 4, 2), (32, 2, 2)])
def test_kernel_matches_sdpa_up_to_each_rows_length(dtype, atol, head_dim, heads, kv_heads):
    assert cpu_attention.kernel(dtype, head_dim, heads // kv_heads) is not None, "the kernel did not build"
    q, k_cache, v_cache, lens = _case(dtype, head_dim, heads, kv_heads)
    scale = head_dim ** -0.5
    out = cpu_attention.decode_fn(q, k_cache, v_cache, lens - 1, scale)
    assert out.dtype == dtype and out.shape == q.shape
    torch.testing.assert_close(out.float(), _reference(q, k_cache, v_cache, lens, scale), atol=atol, rtol=atol)


def test_compiled_op_returns_what_the_plain_call_returns():
    q, k_cache, v_cache, lens = _case(torch.bfloat16, 64, 9, 3)
    step = torch.compile(lambda *a: cpu_attention.decode_attention(*a, 0.125) * 2, dynamic=False)
    want = cpu_attention.decode_fn(q, k_cache, v_cache, lens - 1, 0.125) * 2
    assert torch.equal(step(q, k_cache, v_cache, lens - 1), want)


@pytest.mark.parametrize("dtype,atol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("head_dim,heads,kv_heads", [(64, 9, 3), (16, 4, 2)])
def test_prefill_kernel_is_causal_attention_of_each_row(dtype, atol, head_dim, heads, kv_heads):
    """Rows (slot, first new position, new tokens): from 0, after a cached prefix, longer than a block
    of 16 tokens, one token; packed in one pass, each token attends its slot's positions 0..its own."""
    rows = [(2, 0, 40), (0, 7, 5), (3, 0, 1), (1, 20, 19)]
    g = torch.Generator().manual_seed(1)
    k_cache, v_cache = (torch.randn(4, kv_heads, 64, head_dim, generator=g).to(dtype) for _ in range(2))
    for slot, start, new in rows:  # past the row's last token: NaN, never attended
        k_cache[slot, :, start + new:] = float("nan")
        v_cache[slot, :, start + new:] = float("nan")
    slots = torch.tensor([s for s, _, new in rows for _ in range(new)])
    pos = torch.tensor([start + j for _, start, new in rows for j in range(new)])
    q = torch.randn(len(pos), heads, head_dim, generator=g).to(dtype)
    scale = head_dim ** -0.5
    out = cpu_attention.prefill_fn(q, k_cache, v_cache, slots, pos, scale)
    want, i = [], 0
    for slot, start, new in rows:
        k = k_cache[slot, :, :start + new].float().repeat_interleave(heads // kv_heads, 0)
        v = v_cache[slot, :, :start + new].float().repeat_interleave(heads // kv_heads, 0)
        causal = torch.arange(start + new) <= torch.arange(start, start + new)[:, None]
        qr = q[i:i + new].float().transpose(0, 1)  # [heads, new, D]
        want.append(F.scaled_dot_product_attention(qr, k, v, attn_mask=causal, scale=scale).transpose(0, 1))
        i += new
    torch.testing.assert_close(out.float(), torch.cat(want), atol=atol, rtol=atol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_layer_is_rotary_cache_writes_and_decode(dtype):
    """``decode_layer_fn`` from a fused q/k/v row equals the torch path it replaces in eager decode steps
    (decoder.py ``_rope``, the two cache writes, ``decode_fn``): the cache gets the rotated k and the v
    at each row's position (bitwise in bfloat16, whose rounding it repeats op by op), nothing else of the
    cache changes, and the output matches."""
    heads, kv_heads, head_dim = 9, 3, 64
    q, k_cache, v_cache, lens = _case(dtype, head_dim, heads, kv_heads)
    pos = lens - 1
    g = torch.Generator().manual_seed(5)
    n = len(LENS)
    qkv = torch.randn(n, (heads + 2 * kv_heads) * head_dim, generator=g).to(dtype)
    angle = pos[:, None].float() * torch.rand(head_dim // 2, generator=g).repeat(2)
    cos, sin = angle.cos().to(dtype), angle.sin().to(dtype)
    signed = torch.cat((-sin[:, :head_dim // 2], sin[:, head_dim // 2:]), -1)
    qr, k, v = qkv.view(n, -1, head_dim).split([heads, kv_heads, kv_heads], dim=1)
    want_k, want_v = k_cache.clone(), v_cache.clone()
    want_k[torch.arange(n), :, pos] = _rope(k, cos[:, None], signed[:, None])
    want_v[torch.arange(n), :, pos] = v
    want = cpu_attention.decode_fn(_rope(qr, cos[:, None], signed[:, None]), want_k, want_v, pos, 0.125)
    lib = cpu_attention.kernel(dtype, head_dim, heads // kv_heads)
    out = cpu_attention.decode_layer_fn(lib, qkv, cos, signed, k_cache, v_cache, pos, 0.125, heads)
    exact = {"rtol": 0, "atol": 0} if dtype == torch.bfloat16 else {"rtol": 1e-6, "atol": 1e-6}
    torch.testing.assert_close(k_cache, want_k, equal_nan=True, **exact)
    torch.testing.assert_close(v_cache, want_v, equal_nan=True, rtol=0, atol=0)
    atol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(out.view(n, heads, head_dim).float(), want.float(), atol=atol, rtol=atol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_norm_and_activation_kernels_are_hfs(dtype):
    """``rms_norm_fn`` equals HF's LlamaRMSNorm (after the residual add, which is bitwise torch's), and
    ``silu_mul_fn`` the MLP's ``act_fn(gate) * up``: within float32 rounding, or one bfloat16 step (two for
    the product: its ``expf`` is not torch's, so the rounded activation can differ by one step)."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    g = torch.Generator().manual_seed(2)
    norm = LlamaRMSNorm(576, eps=1e-5)
    norm.weight.data = torch.randn(576, generator=g)
    norm = norm.to(dtype)
    x, res = (3 * torch.randn(8, 576, generator=g).to(dtype) for _ in range(2))
    lib = cpu_attention.kernel(dtype, 64, 3)
    total, h = cpu_attention.rms_norm_fn(lib, x, res, norm.weight, norm.variance_epsilon)
    assert torch.equal(total, x + res)
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2 ** -7, "atol": 0}
    torch.testing.assert_close(h, norm(x + res), **tol)
    same, h = cpu_attention.rms_norm_fn(lib, x, None, norm.weight, norm.variance_epsilon)
    assert same is x
    torch.testing.assert_close(h, norm(x), **tol)
    gate_up = 4 * torch.randn(8, 2 * 1536, generator=g).to(dtype)
    gate, up = gate_up.chunk(2, dim=-1)
    if dtype == torch.bfloat16:  # a step of the rounded activation, then the product's own rounding
        tol = {"rtol": 2 ** -6, "atol": 0}
    torch.testing.assert_close(cpu_attention.silu_mul_fn(lib, gate_up), F.silu(gate) * up, **tol)


def test_loading_the_kernel_keeps_subnormal_floats(tmp_path):
    code = ("import torch; from rollout.engines import cpu_attention as c; "
            "x = torch.tensor([1e-39]); before = (x * 1.0).item(); "
            "assert c.kernel(torch.float32, 64, 3) is not None; print(before, (x * 1.0).item())")
    env = {**os.environ, "ESCRAG_CACHE": str(tmp_path)}  # a fresh build, with today's flags
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    before, after = map(float, out.stdout.split())
    assert before > 0 and after == before, "loading the kernel turned on flush-to-zero"


def test_without_a_compiler_the_engine_decodes_through_sdpa(tiny_model, monkeypatch, caplog):
    monkeypatch.setenv("CC", "/nonexistent/cc")
    monkeypatch.setattr(cpu_attention, "_KERNELS", {})
    eng = HFEngine(tiny_model, load_config("configs/cpu-test.yaml").rollout, seed=0)
    assert eng.decoder.kernel is None and "runs on SDPA" in caplog.text
    prompts = [[1, 504, 2088, 314, 253, 1345, 28, 940, 446], [1, 9519, 28, 940, 446, 2], [1, 77, 78]]
    for prompt, gen in zip(prompts, eng.generate(prompts, SamplingParams(12, 1.0, 1.0, 0, ()), seeds=[1, 2, 3])):
        ids = torch.tensor([prompt + gen.token_ids])  # rows of unequal lengths: SDPA's [rows, longest] layout
        with torch.no_grad():
            logp = eng.model(ids).logits[0].float().log_softmax(-1)[len(prompt) - 1:-1]
        want = logp.gather(-1, torch.tensor(gen.token_ids)[:, None]).squeeze(-1)
        assert torch.allclose(torch.tensor(gen.logprobs), want, atol=1e-4)
