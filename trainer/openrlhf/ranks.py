"""OpenRLHF's actor ranks and our batch sizes: the rule under which every rank gets equal work.

Owns: ``check_rank_split``, which ``Config`` runs at load when ``grpo.backend`` is openrlhf and the
launcher runs again before it emits a command (``--backend`` may choose the backend after load).
"""

from __future__ import annotations

import math

from escrag.config import Config, ConfigError


def check_rank_split(cfg: Config) -> None:
    """Refuse batch sizes with which OpenRLHF 0.11.2 gives its actor ranks unequal work at a step.

    It cuts a rollout batch's S = ``grpo.batch_states`` x ``rollout.group_size`` sequences into
    micro-experiences of ``openrlhf.rollout_micro_batch_size`` (the last one short), hands each of the
    R actor ranks ceil(count / R) of them in order (``RayActorGroup.async_run_method_batch``), and every
    rank trains its share in micro-batches of ``grpo.micro_batch_size``, a short last one dropped, with
    DeepSpeed stepping after S / micro-batch / R of them. Every rank makes the same forwards and
    micro-steps, each ending on the accumulation boundary, exactly when S is a multiple of
    R x lcm(the two micro-batch sizes); otherwise one rank's collective waits for a partner that never
    comes (tests/test_rank_split.py replays OpenRLHF's own code on both sides of this rule)."""
    o, g, n = cfg.openrlhf, cfg.grpo, cfg.rollout.group_size
    ranks, seqs = o.nodes * o.gpus_per_node, g.batch_states * n
    unit = ranks * math.lcm(o.rollout_micro_batch_size, g.micro_batch_size)
    if seqs % unit:
        step = unit // math.gcd(unit, n)
        raise ConfigError(
            f"grpo.batch_states: {g.batch_states} states x {n} samples = {seqs} sequences per step do not split "
            f"evenly over the {ranks} OpenRLHF actor ranks (openrlhf.nodes x gpus_per_node) in micro-batches of "
            f"{o.rollout_micro_batch_size} (openrlhf.rollout_micro_batch_size) and {g.micro_batch_size} "
            f"(grpo.micro_batch_size), so a rank would wait in a collective for one with fewer micro-steps; use a "
            f"multiple of {unit} sequences (batch_states a multiple of {step}, e.g. {-(-g.batch_states // step) * step})")
