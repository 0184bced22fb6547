"""GRPO math as pure tensor functions (paper eq. 9-11): advantages, clipped ratio loss, k3 KL.

Owns: ``group_advantages`` and ``policy_loss``. Tensors in, tensors out: no I/O, no config, no model;
the caller passes every knob (``grpo.adv_eps``, ``clip_eps``, ``kl_coef``, ``ratio_level``, ``loss_agg``),
so no value of the config is repeated here as a default.

Departures from the paper, each selectable:
1. Ratio. Eq. 10 is one ratio per sequence, π_θ(c|·) / π_old(c|·). Like standard GRPO code the
   config defaults to per-token ratios (``grpo.ratio_level: token``); ``"sequence"`` uses
   exp(Σ_t Δlogp_t) over the sequence's trained tokens, i.e. eq. 10 literally, and gives every token
   of a sequence the same clipped surrogate.
2. KL. Eq. 11 has no KL term; Table 4 lists a KL coefficient (0.05). We add the k3 estimator
   exp(ref - logp) - (ref - logp) - 1 per token (non-negative, unbiased for KL(π_θ || π_ref)).
3. Aggregation. ``"token_mean"`` (the config's default) averages over all trained tokens of the batch;
   ``"seq_mean"`` averages per sequence, then over sequences (eq. 11's 1/N Σ_j). ``denom`` lets a
   caller that splits one batch into micro-batches pass the whole batch's token (or sequence) count,
   so the micro-batch losses sum exactly to the whole-batch loss.
4. Off-policy groups (streaming learner, ``grpo.max_staleness`` > 0). Given ``behaviour_logp``, the
   decoupled objective of AReaL (Fu et al. 2025): the ratio is π_θ / π_prox with π_prox the
   learner's recomputed log-probs (``old_logp``), and each token's clipped surrogate is weighted by
   w = π_prox / π_behaviour (no gradient), so the clip bounds the step from π_prox while w corrects
   for the policy that actually sampled. We truncate w at ``weight_cap`` (TIS-style, min(w, C)); AReaL
   instead drops the tokens above its cap. With π_prox == π_behaviour it is the plain loss.
"""

from __future__ import annotations

import torch
from torch import Tensor


def group_advantages(rewards: Tensor, eps: float) -> Tensor:
    """Eq. 9: A = (r - mean_group r) / sqrt(var_group r + eps), population variance.

    rewards: [G, N] (G groups of N samples) -> advantages [G, N]. A constant group gives zeros.
    """
    rewards = rewards.float()
    mean = rewards.mean(dim=-1, keepdim=True)
    var = ((rewards - mean) ** 2).mean(dim=-1, keepdim=True)
    return (rewards - mean) / torch.sqrt(var + eps)


def k3_kl(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """Per-token k3 estimator of KL(π_θ || π_ref): exp(ref - logp) - (ref - logp) - 1. [B, T] -> [B, T]."""
    delta = ref_logp - logp
    return torch.exp(delta) - delta - 1.0


def _aggregate(values: Tensor, mask: Tensor, loss_agg: str, denom: float | None) -> Tensor:
    """Masked reduction of per-token ``values`` [B, T] to a scalar (see module docstring, point 3)."""
    if loss_agg == "token_mean":
        n = mask.sum() if denom is None else denom
        return (values * mask).sum() / max(float(n), 1.0)
    if loss_agg == "seq_mean":
        per_seq = (values * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
        n = mask.shape[0] if denom is None else denom
        return per_seq.sum() / max(float(n), 1.0)
    raise ValueError(f"loss_agg must be 'token_mean' or 'seq_mean', got {loss_agg!r}")


def _ratio(logp: Tensor, old_logp: Tensor, mask: Tensor, ratio_level: str) -> Tensor:
    """Importance ratio per token [B, T]; at sequence level every token carries the sequence ratio."""
    delta = (logp - old_logp) * mask
    if ratio_level == "token":
        return torch.exp(delta)
    if ratio_level == "sequence":
        return torch.exp(delta.sum(-1, keepdim=True)).expand_as(logp)
    raise ValueError(f"ratio_level must be 'token' or 'sequence', got {ratio_level!r}")


def behaviour_weight(old_logp: Tensor, behaviour_logp: Tensor, mask: Tensor, ratio_level: str,
                     cap: float | None = None) -> tuple[Tensor, Tensor]:
    """Decoupled-objective weight π_prox / π_behaviour (point 4), [B, T] -> (raw, truncated at ``cap``),
    both without gradient; at sequence level every token carries its sequence's weight."""
    raw = _ratio(old_logp.detach(), behaviour_logp.detach(), mask, ratio_level)
    return raw, (raw if cap is None else raw.clamp(max=cap))


def policy_loss(logp: Tensor, old_logp: Tensor, ref_logp: Tensor | None, advantages: Tensor, mask: Tensor,
                clip_eps: float, kl_coef: float, ratio_level: str, loss_agg: str, denom: float | None = None,
                behaviour_logp: Tensor | None = None, weight_cap: float | None = None) -> tuple[Tensor, dict]:
    """Clipped GRPO loss (eq. 11, negated for minimisation) plus ``kl_coef`` x k3 KL.

    logp, old_logp, ref_logp, mask: [B, T] (log-probs of the sampled tokens under the current,
    old (π_old of eq. 10) and reference policies; mask 1 on trained tokens). advantages: [B].
    ``ref_logp`` may be None when ``kl_coef`` is 0. ``behaviour_logp`` [B, T] turns on the decoupled
    objective (point 4; ``old_logp`` is then π_prox) with its weight truncated at ``weight_cap``.
    Returns (scalar loss, metrics of detached scalars: pg_loss, kl, clip_frac, ratio_mean, tokens,
    and with ``behaviour_logp`` iw_mean and iw_max of the untruncated weight and iw_truncated_frac).
    """
    mask = mask.to(logp.dtype)
    ratio = _ratio(logp, old_logp, mask, ratio_level)
    adv = advantages.to(logp.dtype).unsqueeze(-1)  # [B, 1]
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * adv
    pg = -torch.minimum(unclipped, clipped)  # [B, T]
    if behaviour_logp is not None:
        raw_w, w = behaviour_weight(old_logp, behaviour_logp, mask, ratio_level, weight_cap)
        pg = w * pg
    pg_loss = _aggregate(pg, mask, loss_agg, denom)
    if kl_coef > 0.0 and ref_logp is not None:
        kl = k3_kl(logp, ref_logp)
        kl_loss = _aggregate(kl, mask, loss_agg, denom)
    else:
        kl = torch.zeros_like(logp)
        kl_loss = pg_loss.new_zeros(())
    loss = pg_loss + kl_coef * kl_loss
    n = mask.sum().clamp(min=1.0)
    with torch.no_grad():
        metrics = {
            "pg_loss": pg_loss.detach(),
            "kl": (kl.detach() * mask).sum() / n,
            "clip_frac": ((clipped < unclipped).to(mask.dtype) * mask).sum() / n,
            "ratio_mean": (ratio.detach() * mask).sum() / n,
            "tokens": mask.sum(),
        }
        if behaviour_logp is not None:
            metrics["iw_mean"] = (raw_w * mask).sum() / n
            metrics["iw_max"] = torch.where(mask > 0, raw_w, torch.zeros_like(raw_w)).max()
            metrics["iw_truncated_frac"] = ((raw_w > w).to(mask.dtype) * mask).sum() / n
    return loss, metrics
