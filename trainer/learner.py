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
  truncated log-probs differ from ours, and for a transformers engine running in another precision
  than the learner, e.g. ``rollout.dtype: auto`` = bfloat16 on this CPU against a float32
  ``policy.dtype``), the learner's own log-probs before its first pass: with one pass per batch
  (``grpo.updates_per_batch`` 1, the default) the first pass's own log-probs, detached, as TRL does
  for one iteration (no extra forward).
  ``logp_diff`` is the mean absolute gap between the two, a check that rollout and learner agree.
- Groups whose rewards are all equal have zero advantage; they are skipped (their KL term too) and
  counted as ``zero_adv_groups``. A batch with nothing left makes no optimizer step.
- Dropout is off (eval mode) so the ratio compares like with like; ``policy.lora.dropout`` only
  affects SFT. ``policy.gradient_checkpointing`` recomputes each decoder layer in the backward pass
  (``trainer.policy.eval_mode`` keeps it working in eval mode): same loss and gradients, less memory.
- Weight export (``export_weights``): under LoRA the merged W + ΔW of the LoRA target modules only
  (HF names of the base model), else every parameter, cast once to ``policy.dtype``; the version
  number increases by one per optimizer step and goes with the weights to the rollout workers, which
  refuse stale versions.

The job runs it as a Ray actor (``LearnerActor``, ``start_learner``) with its own resources
(``grpo.learner_cpus``, ``grpo.learner_gpus``; ``place`` shares a cluster's GPUs between it and the
rollout engines). ``LearnerActor.train`` enforces the staleness bound of the streaming job: a group
more than ``grpo.max_staleness`` versions behind the learner is dropped, counted (``stale_groups``)
and never trained; the new weights go back through the object store, once per version. For stale
groups π_old is the behaviour log-prob recorded with the group, or, when it is recomputed, π_prox of
the decoupled objective (``trainer.grpo`` point 4, ``grpo.decoupled_loss``), whose weight's mean and
max are ``iw_mean`` / ``iw_max``. The KL term is not reweighted.
"""

from __future__ import annotations

import copy
import time

import torch

from escrag.config import Config
from escrag.models import engine_dtype, torch_dtype
from escrag.records import ScoredGroup, TokenSequence
from trainer.grpo import group_advantages, policy_loss
from trainer.policy import (
    build_policy,
    compute,
    eval_mode,
    is_lora,
    lora_merged_weights,
    prefix_tail_logprobs,
    save_merged,
    shared_prefix,
    tail_logprobs,
)


def recompute_old(cfg: Config) -> bool:
    """Whether the learner recomputes π_old (``grpo.recompute_old_logprobs``; None = auto: for vLLM,
    and for a transformers engine whose weights dtype, ``rollout.dtype`` resolved on this machine,
    differs from the learner's compute dtype ``policy.dtype``)."""
    flag = cfg.grpo.recompute_old_logprobs
    if flag is not None:
        return flag
    if cfg.rollout.engine == "vllm":
        return True
    dtype = cfg.policy.compute_dtype
    return engine_dtype(cfg.rollout.dtype, dtype, cfg.rollout.device) != dtype


def decoupled(cfg: Config) -> bool:
    """Whether the decoupled objective weights the loss (``grpo.decoupled_loss``; None: when π_old is
    recomputed and rollouts may be stale, ``grpo.max_staleness`` > 0). It needs recomputed π_old."""
    flag = cfg.grpo.decoupled_loss
    on = recompute_old(cfg) and cfg.grpo.max_staleness > 0 if flag is None else flag
    if on and not recompute_old(cfg):
        from escrag.config import ConfigError

        raise ConfigError("grpo.decoupled_loss: needs grpo.recompute_old_logprobs (π_prox is the recomputed π_old)")
    return on


class Learner:
    def __init__(self, cfg: Config, model: str | None = None):
        g = cfg.grpo
        self.cfg, self.version = cfg, 0
        torch.manual_seed(cfg.run.seed)
        self.model, self.tokenizer = build_policy(cfg.policy, model)
        eval_mode(self.model)
        self.ref = None
        if g.kl_coef > 0 and not is_lora(self.model):
            self.ref = copy.deepcopy(self.model).to(torch_dtype(cfg.policy.compute_dtype)).requires_grad_(False)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=g.lr, weight_decay=0.0)
        self.temperature, self.recompute, self.decoupled = cfg.rollout.temperature, recompute_old(cfg), decoupled(cfg)
        self.share = g.share_prompt and not cfg.policy.gradient_checkpointing

    # ------------------------------------------------------------------ log-probs

    def sequence_logprobs(self, seqs: list[TokenSequence], mask: torch.Tensor, reference: bool = False) -> torch.Tensor:
        """log π(token) over the last ``mask.shape[1]`` positions of each sequence where ``mask`` is 1
        (the trained tokens; 0 elsewhere), [B, keep]; the reference policy when ``reference`` (no
        gradient)."""
        model = self.ref if reference and self.ref is not None else self.model
        with compute(self.cfg.policy, self.model):
            if not reference:
                return self._logprobs(model, seqs, mask)
            with torch.no_grad():
                if self.ref is None and is_lora(self.model):
                    with self.model.disable_adapter():
                        return self._logprobs(model, seqs, mask)
                return self._logprobs(model, seqs, mask)

    def _logprobs(self, model, seqs: list[TokenSequence], mask: torch.Tensor) -> torch.Tensor:
        """The shared-prompt path (``grpo.share_prompt``) when the sequences share a prefix, else
        every sequence in full."""
        ids, pad = [s.input_ids for s in seqs], self.tokenizer.pad_token_id
        shared = shared_prefix(ids, [s.loss_mask.index(1) for s in seqs]) if self.share else 0
        if shared > 0:
            return prefix_tail_logprobs(model, ids, mask, shared, pad, self.temperature)
        return tail_logprobs(model, ids, mask, pad, self.temperature)

    # ------------------------------------------------------------------ update

    def _flatten(self, groups: list[ScoredGroup]) -> tuple[list[list[tuple[TokenSequence, float]]], int]:
        """(sequence, advantage) for every trained sequence, per non-degenerate group."""
        per_group, zero = [], 0
        for grp in groups:
            if grp.is_degenerate:
                zero += 1
                continue
            adv = group_advantages(torch.tensor([grp.rewards]), self.cfg.grpo.adv_eps)[0].tolist()
            per_group.append([(s.sequence, a) for s, a in zip(grp.samples, adv) if any(s.sequence.loss_mask)])
        return [g for g in per_group if g], zero

    def _micro_batches(self, per_group):
        """Micro-batches of one group each under ``grpo.share_prompt`` (its samples share the prompt),
        else length-sorted over the batch (less padding); each item keeps its own advantage."""
        mb = self.cfg.grpo.micro_batch_size
        runs = per_group if self.share else [sorted((it for g in per_group for it in g),
                                                    key=lambda it: len(it[0].input_ids))]
        return [run[i:i + mb] for run in runs for i in range(0, len(run), mb)]

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
        if self.recompute and self.cfg.grpo.updates_per_batch > 1:
            with torch.no_grad():
                old = self.sequence_logprobs(seqs, mask)
        elif self.recompute:  # one pass: π_old is the policy as it enters it, its own log-probs (detached)
            old = None
        ref = self.sequence_logprobs(seqs, mask, reference=True) if self.cfg.grpo.kl_coef > 0 else None
        adv = torch.tensor([a for _, a in batch], device=mask.device)
        return {"mask": mask, "old": old, "ref": ref, "adv": adv, "recorded": behaviour,
                "behaviour": behaviour if self.decoupled else None}

    def _pass(self, micro, prepared, denom: float, first: bool) -> dict:
        """One optimizer step over all micro-batches (gradient accumulation); returns summed metrics."""
        g = self.cfg.grpo
        sums: dict[str, float] = {}
        self.optimizer.zero_grad(set_to_none=True)
        for batch, mb in zip(micro, prepared):
            logp = self.sequence_logprobs([s for s, _ in batch], mb["mask"])
            if mb["old"] is None:
                mb["old"] = logp.detach()  # later passes of this batch keep it
            loss, m = policy_loss(logp, mb["old"], mb["ref"], mb["adv"], mb["mask"], g.clip_eps, g.kl_coef,
                                  g.ratio_level, g.loss_agg, denom, mb["behaviour"], g.behaviour_weight_cap)
            loss.backward()
            n = m["tokens"].item()
            for key in ("kl", "clip_frac", "ratio_mean", "iw_mean", "iw_truncated_frac"):
                if key in m:
                    sums[key] = sums.get(key, 0.0) + m[key].item() * n
            if "iw_max" in m:
                sums["iw_max"] = max(sums.get("iw_max", 0.0), m["iw_max"].item())
            sums["loss"] = sums.get("loss", 0.0) + loss.item()
            sums["tokens"] = sums.get("tokens", 0.0) + n
            if first:  # the learner's log-probs before the update against the recorded ones
                gap = ((logp.detach() - mb["recorded"]).abs() * mb["mask"]).sum().item()
                sums["logp_diff"] = sums.get("logp_diff", 0.0) + gap
        sums["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(self.params, g.max_grad_norm))
        self.optimizer.step()
        return sums

    def step(self, groups: list[ScoredGroup]) -> dict:
        """One GRPO update on a batch of scored groups; returns the step's metrics."""
        t0 = time.perf_counter()
        per_group, zero = self._flatten(groups)
        items = [it for g in per_group for it in g]
        metrics = reward_metrics(groups)
        metrics.update(zero_adv_groups=zero, groups=len(groups), trained_sequences=len(items))
        if not items:
            metrics.update(update_s=time.perf_counter() - t0, trained_tokens=0, optimizer_steps=0)
            return metrics
        g = self.cfg.grpo
        micro = self._micro_batches(per_group)
        denom = float(sum(sum(s.loss_mask) for s, _ in items)) if g.loss_agg == "token_mean" else float(len(items))
        prepared = [self._prepare(b) for b in micro]
        passes = [self._pass(micro, prepared, denom, first=(i == 0)) for i in range(g.updates_per_batch)]
        self.version += 1
        first, last = passes[0], passes[-1]
        n = max(first["tokens"], 1.0)
        metrics.update({k: first[k] / n for k in ("kl", "clip_frac", "ratio_mean", "logp_diff")})
        if self.decoupled:  # the weight π_prox / π_behaviour of the first pass (π_prox is fixed)
            metrics.update(iw_mean=first["iw_mean"] / n, iw_max=first["iw_max"],
                           iw_truncated_frac=first["iw_truncated_frac"] / n)
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
        dtype = torch_dtype(self.cfg.policy.compute_dtype)
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
        n = sum(g.stats.get("risk_checked", len(g.samples)) for g in checked)  # rollouts the check read
        out.update(risk_high_frac=sum(g.stats["risk_high"] for g in checked) / n,
                   risk_elevated_frac=sum(g.stats["risk_elevated"] for g in checked) / n)
    return out


# ---------------------------------------------------------------------- the learner as a Ray actor


def split_stale(groups: list[ScoredGroup], version: int, max_staleness: int) -> tuple[list, list]:
    """(groups at most ``max_staleness`` weights versions behind ``version``, the older ones)."""
    fresh = [g for g in groups if version - g.policy_version <= max_staleness]
    return fresh, [g for g in groups if version - g.policy_version > max_staleness]


class LearnerActor(Learner):
    """The ``Learner`` in its own Ray process (``start_learner``): the job's one entry per step is
    ``train``, which enforces the staleness bound and hands back the new weights through the object
    store; everything else (``state_dict``, ``save_policy``, ...) is the ``Learner``'s."""

    def __init__(self, cfg: Config):
        from escrag.models import actor_env

        actor_env()
        if cfg.grpo.learner_torch_threads:
            torch.set_num_threads(cfg.grpo.learner_torch_threads)
        super().__init__(cfg)

    def train(self, *chunks: list[ScoredGroup]) -> tuple[dict, int, object]:
        """One update on the groups of a step (``chunks``: the workers' lists, in order; Ray resolves
        them from the object store here). Groups more than ``grpo.max_staleness`` versions behind
        this learner are dropped, never trained, and counted. Returns (metrics, version, ObjectRef of
        the exported weights, or None when no optimizer step was made)."""
        import ray

        groups = [g for chunk in chunks for g in chunk]
        fresh, stale = split_stale(groups, self.version, self.cfg.grpo.max_staleness)
        lags = [self.version - g.policy_version for g in fresh]
        m = self.step(fresh)
        m.update(groups=len(groups), stale_groups=len(stale), staleness_max=max(lags, default=0),
                 staleness_mean=sum(lags) / max(len(lags), 1))
        return m, self.version, (ray.put(self.export_weights()) if m["optimizer_steps"] else None)

    def publish(self):
        """The current weights in the object store (a resumed run pushes them to fresh workers)."""
        import ray

        return ray.put(self.export_weights())

    def describe(self) -> dict:
        """Where the actor runs: version, device, torch threads and the Ray resources it holds."""
        import os

        import ray

        return {"version": self.version, "device": str(next(self.model.parameters()).device), "pid": os.getpid(),
                "threads": torch.get_num_threads(), "resources": ray.get_runtime_context().get_assigned_resources()}


def learner_options(cfg: Config) -> dict:
    """Ray options of the learner actor (``grpo.learner_cpus``, ``grpo.learner_gpus``; run ``place``
    first to resolve an automatic GPU share). Never restarted: a dead learner stops the job."""
    decoupled(cfg)  # a bad combination is named here, in the driver, not in the actor
    return {"num_cpus": cfg.grpo.learner_cpus, "num_gpus": cfg.grpo.learner_gpus or 0.0, "max_restarts": 0}


def start_learner(cfg: Config):
    """A ``LearnerActor`` with ``learner_options(cfg)``; returns its handle."""
    import ray

    return ray.remote(LearnerActor).options(**learner_options(cfg)).remote(cfg)


def place(cfg: Config, gpus: float) -> Config:
    """The config with the automatic GPU shares and devices made concrete for a Ray cluster with
    ``gpus`` GPUs, so that the learner and the rollout engines never share one unaccounted.

    Who wants a GPU: the learner unless ``policy.device`` is cpu; each rollout worker when its engine
    is vLLM or ``rollout.device`` is not cpu. Explicit ``grpo.learner_gpus`` / ``rollout.worker_gpus``
    are kept; the automatic ones share what they leave: a whole GPU each when there are enough, else
    equal fractions that pack onto the GPUs (1 GPU, learner + 1 worker: 0.5 each); when explicit
    shares take every GPU, the automatic ones get none. No GPU: CPU for all; a vLLM worker too with
    vLLM's CPU build, while a CUDA build keeps asking for one (a GPU node may join the cluster). Mixing explicit and automatic shares on several GPUs may not pack: set both. ``auto`` devices then follow the shares: Ray 2.60 leaves
    every GPU visible to an actor that asked for none, so an actor with no share is told cpu."""
    import dataclasses
    import math

    g, ro = cfg.grpo, cfg.rollout
    from rollout.engines.vllm_engine import cpu_build

    learner_auto = g.learner_gpus is None and cfg.policy.device != "cpu" and gpus > 0
    vllm_gpu = ro.engine == "vllm" and (gpus > 0 or not cpu_build())
    workers_auto = ro.worker_gpus is None and (vllm_gpu or (ro.device != "cpu" and gpus > 0))
    takers = int(learner_auto) + ro.num_workers * int(workers_auto)
    fixed = (g.learner_gpus or 0.0) + ro.num_workers * (ro.worker_gpus or 0.0)
    if takers == 0:
        share = 0.0
    elif gpus == 0:
        share = 1.0  # only CUDA vLLM workers get here: they ask for a GPU and wait for one
    elif fixed == 0:
        share = 1.0 if takers <= gpus else 1.0 / math.ceil(takers / gpus)
    else:  # what the explicit shares leave (nothing left: the automatic ones run on the CPU)
        share = min(1.0, math.floor(100 * max(gpus - fixed, 0.0) / takers) / 100)
    learner_gpus = g.learner_gpus if g.learner_gpus is not None else (share if learner_auto else 0.0)
    worker_gpus = ro.worker_gpus if ro.worker_gpus is not None else (share if workers_auto else 0.0)

    def device(current: str, share: float) -> str:
        return ("cuda" if share > 0 else "cpu") if current == "auto" else current

    return dataclasses.replace(
        cfg, grpo=dataclasses.replace(g, learner_gpus=learner_gpus),
        policy=dataclasses.replace(cfg.policy, device=device(cfg.policy.device, learner_gpus)),
        rollout=dataclasses.replace(ro, worker_gpus=worker_gpus, device=device(ro.device, worker_gpus)))
