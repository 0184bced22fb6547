"""The sampled distribution and token log-probs: one definition for every engine and the learner.

Owns: ``sample`` (one decode step for a batch of rows) and ``token_logprobs``.

Distribution of one step for a row with logits z (Table 4: T 0.9, top-p 0.95): divide by the
temperature T; keep the ``top_k`` largest (0: all); among them keep the smallest best-first prefix
whose probability mass reaches ``top_p`` (the best token is always kept); renormalise and draw. T = 0
is greedy.

Noise. Each row brings its own seed; the draw at decode step t is a Gumbel-max race whose uniform for
token v is a counter-based hash of (seed, t, v). So a row's tokens depend only on its seed and its
logits: not on the other rows of the batch, on their order, on which thread ran first, on continuous
batching, or on a resumed run. A group of N samples uses N derived seeds (``escrag.seeds``).

Log-probs. ``token_logprobs`` is log-softmax(z / T) at the token over the whole vocabulary (T = 0
counts as 1), as verl, OpenRLHF and TRL compute them: the engines record it as the behaviour
log-prob and the learner recomputes it for the ratio of eq. 10. It ignores the top-k/top-p cut; the
sampling distribution is slightly sharper than the one the ratio assumes, as in those frameworks.
"""

from __future__ import annotations

import torch

_M32 = 0xFFFFFFFF
_MIX = 0x45D9F3B  # < 2**27: products of 32-bit values stay below 2**63 in int64
_GOLDEN = 0x9E3779B1


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash on int64 tensors holding values in [0, 2**32)."""
    x = x ^ (x >> 16)
    x = (x * _MIX) & _M32
    x = x ^ (x >> 16)
    x = (x * _MIX) & _M32
    return x ^ (x >> 16)


def uniforms(seeds: torch.Tensor, steps: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Uniforms in (0, 1) for each row's candidate tokens: seeds, steps [B] int64; tokens [B, K]."""
    row = _mix32(_mix32(seeds & _M32) ^ (steps & _M32))  # [B]
    h = _mix32((row[:, None] + tokens * _GOLDEN) & _M32)  # [B, K]
    return ((h >> 8).to(torch.float32) + 0.5) / float(1 << 24)


def sample(logits: torch.Tensor, temperature: float, top_p: float, top_k: int, seeds: torch.Tensor,
           steps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One decode step. logits [B, V]; seeds, steps [B] int64 -> (tokens [B], log-probs [B]).

    Log-probs are ``token_logprobs`` of the drawn tokens (module doc)."""
    logits = logits.float()
    if temperature == 0:
        tok = logits.argmax(dim=-1)
        return tok, token_logprobs(logits, tok, temperature)
    scaled = logits / temperature
    if 0 < top_k < scaled.shape[-1]:
        vals, idx = scaled.topk(top_k, dim=-1)  # sorted, largest first
    else:
        vals, idx = scaled.sort(dim=-1, descending=True)
    logp = vals.log_softmax(dim=-1)
    if top_p < 1.0:
        probs = logp.exp()
        before = probs.cumsum(dim=-1) - probs  # mass of the better tokens; the best is always kept
        logp = logp.masked_fill(before >= top_p, float("-inf"))
    gumbel = -torch.log(-torch.log(uniforms(seeds, steps, idx)))
    choice = (logp + gumbel).argmax(dim=-1, keepdim=True)
    tok = idx.gather(-1, choice).squeeze(-1)
    return tok, token_logprobs(logits, tok, temperature)


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float) -> torch.Tensor:
    """log-softmax(logits / T) at ``tokens``: logits [..., V], tokens [...] -> [...] float32."""
    t = temperature if temperature > 0 else 1.0
    scaled = logits.to(torch.float32, copy=True)
    if t != 1.0:
        scaled.div_(t)  # in place on the copy: one pass over [..., V] fewer than ``logits.float() / t``
    nll = torch.nn.functional.cross_entropy(scaled.reshape(-1, scaled.shape[-1]), tokens.reshape(-1), reduction="none")
    return -nll.view(tokens.shape)  # cross_entropy: log-softmax and gather fused, and a lighter backward
