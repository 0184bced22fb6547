"""bfloat16 linears on a CPU without bfloat16 instructions (AVX2: no AVX512-BF16, no AMX).

Owns: ``emulate_bf16_linears(model)``, which makes every ``nn.Linear`` of a model compute a bfloat16
product on the CPU as a float32 GEMM over the bfloat16-rounded operands, rounded to bfloat16 once:
the numbers PyTorch's own bfloat16 GEMM gives there (it too multiplies bfloat16 values and sums in
float32), in another summation order, at float32 GEMM speed. PyTorch has no fast bfloat16 GEMM for
such a CPU (oneDNN's needs AVX512); its fallback ran the tiny test model's LM head (2,048 x 64 x
49,152) in 15.7 s against 0.56 s in float32 on one AVX2 core (``bench/bench_cpu_bf16.py``).

It covers both ways bfloat16 reaches a linear here: bfloat16 weights and inputs (the rollout engine,
the KL reference, a bfloat16 RM backbone) and float32 weights under ``torch.autocast("cpu",
bfloat16)`` (the learner, SFT, the crisis check's backbone), where it rounds the operands as autocast
would. Gradients pass through the same casts. Anything else (float32, a GPU) runs the plain
``nn.Linear``. ``escrag.models`` applies it where ``fast_bfloat16("cpu")`` is False; on a CPU with
AMX / AVX512-BF16 models keep PyTorch's native kernels.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class EmulatedBF16Linear(torch.nn.Linear):
    """An ``nn.Linear`` whose bfloat16 products on the CPU run as float32 GEMMs (see the module doc);
    the same parameters and state dict as the ``nn.Linear`` it replaces."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type != "cpu":
            return super().forward(x)
        bf16 = torch.bfloat16
        autocast = torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == bf16
        if not autocast and not (x.dtype == bf16 and self.weight.dtype == bf16):
            return super().forward(x)
        with torch.autocast("cpu", enabled=False):
            bias = None if self.bias is None else self.bias.to(bf16).float()
            return F.linear(x.to(bf16).float(), self.weight.to(bf16).float(), bias).to(bf16)


def emulate_bf16_linears(model: torch.nn.Module) -> torch.nn.Module:
    """Every plain ``nn.Linear`` of ``model`` made an ``EmulatedBF16Linear`` in place; returns it."""
    for module in model.modules():
        if type(module) is torch.nn.Linear:
            module.__class__ = EmulatedBF16Linear
    return model
