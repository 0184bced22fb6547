"""The single-machine GRPO learner: policy, frozen reference, clipped-GRPO update, weight export.

Owns: ``Learner``. It takes ``ScoredGroup``s from the rollout (escrag/records.py), computes eq. 9
advantages per group, and runs ``grpo.updates_per_batch`` optimizer steps over the batch in
micro-batches with gradient accumulation (``trainer.grpo.policy_loss`` with the whole batch's
denominator, so the accumulated gradient equals the whole-batch gradient). It trains exactly the tokens
whose ``loss_mask`` is 1 (masks are set by the rollout) and exports weights for the rollout workers.

- Precision and device (``trainer.policy``): float32 master weights on ``policy.device``, forward
  passes under autocast to ``policy.dtype``; the frozen reference is kept in ``policy.dtype``.
- Reference policy: under LoRA, the same model with the adapter disabled (no second copy); otherwise a
  frozen copy of the initial weights. With ``kl_coef`` 0 no reference is run.
- Log-probs are log-softmax(logits / T) with T the sampling temperature (``escrag.sampling``), the
  quantity the engines record. π_old of eq. 10 is the behaviour log-prob the rollout recorded, or,
  with ``grpo.recompute_old_logprobs`` (default: on for the vLLM engine, whose bfloat16 kernels and
  truncated log-probs differ from ours), the learner's own log-probs before its first pass.
  ``logp_diff`` is the mean absolute gap between the two, a check that rollout and learner agree.
- Groups whose rewards are all equal have zero advantage; they are skipped (their KL term too) and
  counted as ``zero_adv_groups``. A batch with nothing left makes no optimizer step.
- Dropout is off (eval mode) so the ratio compares like with like; ``policy.lora.dropout`` only
  affects SFT.
- Weight export (``export_weights``): under LoRA the merged W + ΔW of the LoRA target modules only
  (HF names of the base model), else every parameter, cast once to ``policy.dtype``; the version
  number increases by one per optimizer step and goes with the weights to the rollout workers, which
  refuse stale versions.
"""

from __future__ import annotations

import copy
import time

import torch

from escrag.config import Config
from escrag.models import torch_dtype
from escrag.records import ScoredGroup, TokenSequence
from trainer.grpo import group_advantages, policy_loss
from trainer.policy import build_policy, compute, is_lora, lora_merged_weights, save_merged, tail_logprobs


def recompute_old(cfg: Config) -> bool:
    """Whether the learner recomputes π_old (``grpo.recompute_old_logprobs``; None: for vLLM only)."""
    flag = cfg.grpo.recompute_old_logprobs
    return cfg.rollout.engine == "vllm" if flag is None else flag


class Learner:
    def __init__(self, cfg: Config, model: str | None = None):
        g = cfg.grpo
        self.cfg, self.version = cfg, 0
        torch.manual_seed(cfg.run.seed)
        self.model, self.tokenizer = build_policy(cfg.policy, model)
        self.model.eval()
        self.ref = None
        if g.kl_coef > 0 and not is_lora(self.model):
            self.ref = copy.deepcopy(self.model).to(torch_dtype(cfg.policy.dtype)).requires_grad_(False)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=g.lr, weight_decay=0.0)
        self.temperature, self.recompute = cfg.rollout.temperature, recompute_old(cfg)

    # ------------------------------------------------------------------ log-probs

    def sequence_logprobs(self, seqs: list[TokenSequence], keep: int, reference: bool = False) -> torch.Tensor:
        """log π(token) over the last ``keep`` positions of each sequence, [B, keep]; the reference
        policy when ``reference`` (no gradient)."""
        ids, pad = [s.input_ids for s in seqs], self.tokenizer.pad_token_id
        model = self.ref if reference and self.ref is not None else self.model
        with compute(self.cfg.policy, self.model):
            if not reference:
                return tail_logprobs(model, ids, keep, pad, self.temperature)
            with torch.no_grad():
                if self.ref is None and is_lora(self.model):
                    with self.model.disable_adapter():
                        return tail_logprobs(model, ids, keep, pad, self.temperature)
                return tail_logprobs(model, ids, keep, pad, self.temperature)

    # ------------------------------------------------------------------ update

    def _flatten(self, groups: list[ScoredGroup]) -> tuple[list[tuple[TokenSequence, float]], int]:
        """(sequence, advantage) for every trained sequence of the non-degenerate groups."""
        items, zero = [], 0
        for grp in groups:
            if grp.is_degenerate:
                zero += 1
                continue
            adv = group_advantages(torch.tensor([grp.rewards]), self.cfg.grpo.adv_eps)[0].tolist()
            items += [(s.sequence, a) for s, a in zip(grp.samples, adv) if any(s.sequence.loss_mask)]
        return items, zero

    def _micro_batches(self, items):
        """Length-sorted micro-batches (less padding); each item keeps its own advantage."""
        items = sorted(items, key=lambda it: len(it[0].input_ids))
        mb = self.cfg.grpo.micro_batch_size
        return [items[i:i + mb] for i in range(0, len(items), mb)]

    def _tails(self, batch, keep: int):
        """Loss mask and behaviour log-probs over the last ``keep`` positions (left-padded with 0),
        [B, keep], on the learner's device."""
        mask = torch.zeros(len(batch), keep)
        old = torch.zeros(len(batch), keep)
        for i, (seq, _) in enumerate(batch):
            n = min(keep, len(seq.input_ids))
            mask[i, keep - n:] = torch.tensor(seq.loss_mask[-n:], dtype=torch.float32)
            old[i, keep - n:] = torch.tensor(seq.old_logprobs[-n:], dtype=torch.float32)
        device = next(self.model.parameters()).device
        return mask.to(device), old.to(device)

    @staticmethod
    def _keep(batch) -> int:
        """Positions from the first trained token to the end, over the micro-batch."""
        return max(len(s.input_ids) - s.loss_mask.index(1) for s, _ in batch)

    def _prepare(self, batch) -> dict:
        """What a micro-batch needs before any update: mask, π_old (behaviour, or recomputed), the
        reference log-probs, advantages, and the rollout/learner log-prob gap."""
        keep, seqs = self._keep(batch), [s for s, _ in batch]
        mask, behaviour = self._tails(batch, keep)
        old = behaviour
        if self.recompute:
            with torch.no_grad():
                old = self.sequence_logprobs(seqs, keep)
        ref = self.sequence_logprobs(seqs, keep, reference=True) if self.cfg.grpo.kl_coef > 0 else None
        adv = torch.tensor([a for _, a in batch], device=mask.device)
        return {"keep": keep, "mask": mask, "old": old, "ref": ref, "adv": adv,
                "gap": ((old - behaviour).abs() * mask).sum().item() if self.recompute else None}

    def _pass(self, micro, prepared, denom: float, first: bool) -> dict:
        """One optimizer step over all micro-batches (gradient accumulation); returns summed metrics."""
        g = self.cfg.grpo
        sums: dict[str, float] = {}
        self.optimizer.zero_grad(set_to_none=True)
        for batch, mb in zip(micro, prepared):
            logp = self.sequence_logprobs([s for s, _ in batch], mb["keep"])
            loss, m = policy_loss(logp, mb["old"], mb["ref"], mb["adv"], mb["mask"], g.clip_eps, g.kl_coef,
                                  g.ratio_level, g.loss_agg, denom)
            loss.backward()
            n = m["tokens"].item()
            for key in ("kl", "clip_frac", "ratio_mean"):
                sums[key] = sums.get(key, 0.0) + m[key].item() * n
            sums["loss"] = sums.get("loss", 0.0) + loss.item()
            sums["tokens"] = sums.get("tokens", 0.0) + n
            if first:
                gap = mb["gap"] if mb["gap"] is not None else ((logp.detach() - mb["old"]).abs() * mb["mask"]).sum().item()
                sums["logp_diff"] = sums.get("logp_diff", 0.0) + gap
        sums["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(self.params, g.max_grad_norm))
        self.optimizer.step()
        return sums

    def step(self, groups: list[ScoredGroup]) -> dict:
        """One GRPO update on a batch of scored groups; returns the step's metrics."""
        t0 = time.perf_counter()
        items, zero = self._flatten(groups)
        metrics = reward_metrics(groups)
        metrics.update(zero_adv_groups=zero, groups=len(groups), trained_sequences=len(items))
        if not items:
            metrics.update(update_s=time.perf_counter() - t0, trained_tokens=0, optimizer_steps=0)
            return metrics
        g = self.cfg.grpo
        micro = self._micro_batches(items)
        denom = float(sum(sum(s.loss_mask) for s, _ in items)) if g.loss_agg == "token_mean" else float(len(items))
        prepared = [self._prepare(b) for b in micro]
        passes = [self._pass(micro, prepared, denom, first=(i == 0)) for i in range(g.updates_per_batch)]
        self.version += 1
        first, last = passes[0], passes[-1]
        n = max(first["tokens"], 1.0)
        metrics.update({k: first[k] / n for k in ("kl", "clip_frac", "ratio_mean", "logp_diff")})
        metrics.update(clip_frac=last["clip_frac"] / n, loss=first["loss"], grad_norm=first["grad_norm"],
                       trained_tokens=int(first["tokens"]), optimizer_steps=len(passes),
                       update_s=time.perf_counter() - t0)
        metrics["update_tokens_per_s"] = metrics["trained_tokens"] * len(passes) / metrics["update_s"]
        return metrics

    # ------------------------------------------------------------------ weights and state

    @torch.no_grad()
    def export_weights(self) -> dict[str, torch.Tensor]:
        """Weights to push to the rollout workers (see module docstring): HF names of the base model,
        on the CPU, cast once to ``policy.dtype``."""
        dtype = torch_dtype(self.cfg.policy.dtype)
        if is_lora(self.model):
            weights = lora_merged_weights(self.model)
        else:
            weights = {n: p.detach() for n, p in self.model.named_parameters()}
        return {k: v.to("cpu", dtype, copy=True).contiguous() for k, v in weights.items()}

    def state_dict(self) -> dict:
        """Trainable parameters, optimizer and version: what a checkpoint needs to resume exactly."""
        return {"trainable": {n: p.detach().clone() for n, p in self.model.named_parameters() if p.requires_grad},
                "optimizer": self.optimizer.state_dict(), "version": self.version}

    def load_state_dict(self, state: dict) -> None:
        named = dict(self.model.named_parameters())
        missing = sorted(set(state["trainable"]) ^ {n for n, p in named.items() if p.requires_grad})
        if missing:
            raise ValueError(f"checkpoint does not match the policy's trainable parameters: {missing[:3]}")
        with torch.no_grad():
            for name, tensor in state["trainable"].items():
                named[name].copy_(tensor)
        self.optimizer.load_state_dict(state["optimizer"])
        self.version = int(state["version"])

    def save_policy(self, out, meta: dict | None = None):
        """A plain model folder (LoRA merged) that ``escrag.models.load_causal_lm`` loads."""
        return save_merged(self.model, self.tokenizer, out, meta={"version": self.version, **(meta or {})})


def reward_metrics(groups: list[ScoredGroup]) -> dict:
    """Mean/std of the total reward and means of its parts over every sample of the batch, and the
    share of rollouts the crisis check found high / elevated (when the workers ran it)."""
    samples = [s for g in groups for s in g.samples]
    if not samples:
        return {}
    r = torch.tensor([s.reward for s in samples], dtype=torch.float64)
    out = {"reward_mean": r.mean().item(), "reward_std": r.std(unbiased=False).item(),
           "rm_mean": sum(s.rm_score for s in samples) / len(samples),
           "format_mean": sum(s.format_reward for s in samples) / len(samples)}
    checked = [g for g in groups if "risk_high" in g.stats]  # safety.rollout_metric (rollout/worker.py)
    if checked:
        n = sum(len(g.samples) for g in checked)
        out.update(risk_high_frac=sum(g.stats["risk_high"] for g in checked) / n,
                   risk_elevated_frac=sum(g.stats["risk_elevated"] for g in checked) / n)
    return out
