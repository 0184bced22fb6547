"""Native attention for the transformers engine on the CPU.

Owns: ``decode_fn`` (one token a row) and ``decode_attention`` (the same as a torch op, which compiled
decode steps call), ``prefill_fn`` (packed tokens, causal), the decode step's other layer kernels
(``decode_layer_fn``: rotary embedding + K/V writes + attention from the fused projection;
``rms_norm_fn``; ``silu_mul_fn``: the decoder's ``_native_layers``), and the build of their kernels,
``cpu_attention.c``, compiled once per (head_dim, query heads per K/V head) with the C compiler
(``$CC``, else ``cc``) into ``$ESCRAG_CACHE`` (~0.5 s) and loaded with ctypes.

Why: a decode step's attention is a few hundred kilobytes of K/V per layer and row, read by 3 query
heads. PyTorch's SDPA runs it as per-head GEMMs with an explicit mask (overhead-bound: ~160 µs a layer
at batch 8 on this CPU), and every row attends the longest row's length. The decode kernel reads each
row's K/V once, only up to its own length, with the query heads and accumulators in registers: 3-4x
less time a layer. A prefill pass through SDPA lays its rows out as [rows, longest row] with an
explicit causal mask, so it computes every (query, key) pair of that rectangle; the prefill kernel
computes the causal triangle of each row alone: ~5x less time (docs/rollout.md).

- float32 and bfloat16 (softmax and sums in float32); other dtypes use SDPA (``kernel`` is None).
- Built with ``-ffast-math`` for the reductions and vectorised ``expf``, compiled and linked in two
  steps: a shared library linked with ``-ffast-math`` sets flush-to-zero for the whole process.
- OpenMP: the library links ``libgomp.so.1``, the one torch has already loaded, so the kernel runs on
  the calling thread's OpenMP team like torch's own ops (a second runtime would add a second pool).
- No compiler, or a failed build: a warning once, and the engine keeps SDPA.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
from pathlib import Path

import torch

from escrag.models import build_once, cpu_class

log = logging.getLogger(__name__)
SOURCE = Path(__file__).with_name("cpu_attention.c")
DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16"}
_KERNELS: dict[tuple, object] = {}  # (head_dim, groups) -> the loaded library, or None: unavailable


def _flags() -> list[str]:
    x86 = platform.machine().lower() in ("x86_64", "amd64")
    # an AVX2 class on an AVX-512 CPU (ATEN_CPU_CAPABILITY / ONEDNN_MAX_CPU_ISA, escrag.models.cpu_class):
    # the kernels keep to that class's instructions too
    march = {"baseline": "x86-64-v2", "avx2": "x86-64-v3"}.get(cpu_class(), "native") if x86 else "native"
    flags = ["-O3", f"-march={march}", "-ffast-math", "-fopenmp", "-fPIC"]
    if x86:
        flags.append("-mprefer-vector-width=512")  # a no-op without AVX512
    return flags


def _cpu() -> str:
    """The CPU's instruction-set flags (Linux), else its architecture."""
    try:
        with open("/proc/cpuinfo") as fh:
            return next((line for line in fh if line.startswith(("flags", "Features"))), platform.machine())
    except OSError:
        return platform.machine()


def _build(cc: str, head_dim: int, groups: int, out: Path) -> None:
    obj = out / "attention.o"
    for cmd in ([cc, *_flags(), f"-DD={head_dim}", f"-DG={groups}", "-c", str(SOURCE), "-o", str(obj)],
                [cc, "-shared", "-fopenmp", str(obj), "-o", str(out / "attention.so"), "-lm"]):
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"`{' '.join(cmd)}` failed:\n{proc.stderr[-2000:]}")


def kernel(dtype: torch.dtype, head_dim: int, groups: int):
    """The kernels' library for these shapes (built on first use), or None where it cannot be had
    (then the engine attends through SDPA)."""
    if dtype not in DTYPES:
        return None
    if (head_dim, groups) not in _KERNELS:
        _KERNELS[head_dim, groups] = _load(head_dim, groups)
    return _KERNELS[head_dim, groups]


def _load(head_dim: int, groups: int):
    cc = shutil.which(os.environ.get("CC", "cc"))
    if cc is None or not torch.backends.openmp.is_available():
        log.warning("no C compiler (%s) or OpenMP: the engine's attention runs on SDPA", os.environ.get("CC", "cc"))
        return None
    version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout
    # -march=native: a library built on one CPU may not run on another sharing $ESCRAG_CACHE
    digest = hashlib.sha256("\n".join([SOURCE.read_text(), version, *_flags(), _cpu()]).encode()).hexdigest()[:16]
    try:
        folder = build_once(f"cpu-attention-{digest}-d{head_dim}-g{groups}",
                            lambda out: _build(cc, head_dim, groups, out))
    except RuntimeError as e:
        log.warning("attention kernels not built, SDPA instead: %s", e)
        return None
    lib = ctypes.CDLL(str(folder / "attention.so"))
    for dtype in DTYPES.values():
        for name, pointers in (("decode_attention", 5), ("prefill_attention", 6), ("decode_layer", 7)):
            fn = getattr(lib, f"{name}_{dtype}")
            fn.restype = ctypes.c_int
            fn.argtypes = [ctypes.c_void_p] * pointers + [ctypes.c_int64] * 4 + [ctypes.c_float]
        fn = getattr(lib, f"rms_norm_{dtype}")
        fn.restype = None
        fn.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int64] * 2 + [ctypes.c_float]
        fn = getattr(lib, f"silu_mul_{dtype}")
        fn.restype = None
        fn.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_int64] * 2
    return lib


def _call(name: str, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, index: list[torch.Tensor],
          scale: float) -> torch.Tensor:
    """``<name>_attention`` of q [n, heads, head_dim] over the caches ([slots, kv_heads, positions,
    head_dim], the last two dims contiguous); ``index``: the int64 tensors it reads per row or token."""
    q, index = q.contiguous(), [t.contiguous() for t in index]
    fn = getattr(kernel(q.dtype, q.shape[-1], q.shape[1] // k_cache.shape[1]), f"{name}_attention_{DTYPES[q.dtype]}")
    out = torch.empty_like(q)
    if fn(q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), out.data_ptr(), *(t.data_ptr() for t in index),
          q.shape[0], k_cache.shape[1], k_cache.stride(0), k_cache.stride(1), scale):
        raise MemoryError(f"{name} attention: out of memory for a work item's scores")
    return out


def decode_fn(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, pos: torch.Tensor,
              scale: float) -> torch.Tensor:
    """q [n, heads, head_dim], one token a row: row r attends positions [0, pos[r]] of slot r."""
    return _call("decode", q, k_cache, v_cache, [pos], scale)


def prefill_fn(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
               pos: torch.Tensor, scale: float) -> torch.Tensor:
    """q [N, heads, head_dim], packed tokens: token i attends positions [0, pos[i]] of slot slots[i]."""
    return _call("prefill", q, k_cache, v_cache, [slots, pos], scale)


def decode_layer_fn(lib, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
                    v_cache: torch.Tensor, pos: torch.Tensor, scale: float, heads: int) -> torch.Tensor:
    """A decode step's attention from the fused projection: qkv [n, (heads + 2 * kv_heads) * head_dim]
    (q, k, v heads), cos and signed sin [n, head_dim] (decoder.py ``_rope``). Row r's rotated k and its v
    go to position pos[r] of slot r, then its rotated q heads attend [0, pos[r]]; returns [n, heads *
    head_dim]. One call for what is otherwise rotary embedding, two cache writes and ``decode_fn``."""
    kvh, head_dim = k_cache.shape[1], k_cache.shape[-1]
    out = qkv.new_empty(qkv.shape[0], heads * head_dim)
    fn = getattr(lib, f"decode_layer_{DTYPES[qkv.dtype]}")
    if fn(qkv.data_ptr(), cos.data_ptr(), sin.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), out.data_ptr(),
          pos.data_ptr(), qkv.shape[0], kvh, k_cache.stride(0), k_cache.stride(1), scale):
        raise MemoryError("decode attention: out of memory for a work item's scores")
    return out


def rms_norm_fn(lib, x: torch.Tensor, res: torch.Tensor | None, weight: torch.Tensor,
                eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """HF's RMSNorm of the rows of x [n, E] (contiguous), after ``x + res`` where res is given, as one
    native call: (the sum, or x; the normalised rows times ``weight``), rounded where HF's rounds."""
    h = torch.empty_like(x)
    out = torch.empty_like(x) if res is not None else x
    getattr(lib, f"rms_norm_{DTYPES[x.dtype]}")(x.data_ptr(), None if res is None else res.data_ptr(),
                                                  weight.data_ptr(), out.data_ptr(), h.data_ptr(), x.shape[0],
                                                  x.shape[-1], eps)
    return out, h


def silu_mul_fn(lib, gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` of gate_up [n, 2m] (gate, up) as one native call: [n, m], rounded where HF's
    ``act_fn(gate) * up`` rounds."""
    out = gate_up.new_empty(gate_up.shape[0], gate_up.shape[1] // 2)
    getattr(lib, f"silu_mul_{DTYPES[gate_up.dtype]}")(gate_up.data_ptr(), out.data_ptr(), *out.shape)
    return out


# A Library op rather than ``custom_op`` (whose Python wrapper costs ~7 µs a call): compiled decode
# steps call it as an extern kernel; inputs are the cache tensors themselves, so the graph orders the
# call after the step's K/V writes.
_LIB = torch.library.Library("escrag_attention", "DEF")
_LIB.define("decode(Tensor q, Tensor k_cache, Tensor v_cache, Tensor pos, float scale) -> Tensor")
_LIB.impl("decode", decode_fn, "CPU")
decode_attention = torch.ops.escrag_attention.decode.default


@torch.library.register_fake("escrag_attention::decode")
def _(q, k_cache, v_cache, pos, scale):
    return q.new_empty(q.shape)
