"""The local GRPO training loop (paper 3.3, Algorithm 1 lines 3-17): rollouts from the workers, one
learner update per step, weights pushed back, checkpoints, resume, validation and metrics.

Owns: ``fit`` (the loop, with a ``LearnerActor`` handle and a ``RolloutPool``), ``Lookahead`` (the bounded
buffer of rollout batches in flight: with ``grpo.max_staleness`` k > 0 the workers generate the next k
steps while the learner trains; the learner drops a group more than k versions behind it), the atomic
checkpoint every ``grpo.checkpoint_every`` steps and ``--resume`` from the latest (learner state,
sampler position, weights version), the validation every ``grpo.eval_every`` steps on
``grpo.eval_states`` held-out states (``evaluate``: the same rollout, never trained, logged under
``eval/``), and the rows of ``<output_dir>/metrics.jsonl`` / ``samples.jsonl``. The job that starts Ray,
the services, the workers and the learner around it is ``ray_jobs/train_grpo.py``.

Departures from the paper (see trainer/grpo.py for the loss): with ``grpo.max_staleness`` 0 (default)
rollouts and updates alternate (fully on-policy, no overlap), with k > 0 the learner trains groups up
to k versions old (off-policy, corrected in the loss); the paper's batch of 128 states and 2 epochs are
config values (``grpo.batch_states``, ``grpo.epochs`` or ``grpo.steps``).
"""

from __future__ import annotations

import random
import sys
import time
from collections import deque

from escrag.config import Config, output_path
from escrag.errors import ServiceError
from trainer.sampler import StateSampler, total_steps


def train_states(cfg: Config) -> list:
    """The train dialogue states, subsampled (seeded) to ``data.max_train_states``."""
    from escrag.data import load_states

    states = load_states(cfg.data.train)
    k = cfg.data.max_train_states
    if k and k < len(states):
        states = random.Random(cfg.run.seed).sample(states, k)
    return states


def eval_states(cfg: Config) -> list:
    """The held-out states of every validation of the run: ``grpo.eval_states`` of the ``data.eval``
    split, a sample seeded by the run seed only (the same at every validation); [] when
    ``grpo.eval_every`` is 0. They are never trained on (tests/test_train_job.py checks the splits)."""
    from escrag.data import load_states
    from escrag.seeds import derive_seed

    if not cfg.grpo.eval_every:
        return []
    states = load_states(cfg.data.eval)
    return random.Random(derive_seed(cfg.run.seed, "eval-states")).sample(states, min(cfg.grpo.eval_states, len(states)))


def evaluate(cfg: Config, pool, states: list, step: int, log=print) -> dict:
    """The validation after ``step``: each held-out state through the training rollout (two-stage with
    ``rollout.rag``, ``rollout.group_size`` samples at the rollout temperature, seeds fixed per state so
    that two validations differ only by the weights), scored by the reward service, trained on never.
    Returns the rollout metrics (mean reward, RM and format parts, risk shares) under ``eval/``."""
    from escrag.seeds import derive_seed
    from trainer.learner import reward_metrics

    t0 = time.perf_counter()
    groups = pool.generate(states, [derive_seed(cfg.run.seed, "eval", s.state_id) for s in states])
    out = {**{f"eval/{k}": v for k, v in reward_metrics(groups).items()}, **stage1_format(groups, "eval/")}
    log(f"[eval] step {step}: reward {out['eval/reward_mean']:.3f} (format {out['eval/format_mean']:.2f}) on "
        f"{len(states)} held-out {cfg.data.eval} states")
    return {**out, "eval/states": len(groups), "eval/version": min(g.policy_version for g in groups),
            "eval/s": time.perf_counter() - t0}


class Lookahead:
    """The bounded buffer between the rollout workers and the learner: the rollout batches of the
    coming steps, submitted in step order, at most ``grpo.max_staleness`` + 1 at a time (the step
    being trained and the next k). Each batch keeps the sampler position after it, so a checkpoint
    records the position of the last trained step and a resume redraws the batches in flight."""

    def __init__(self, cfg: Config, pool, states: list, sampler, start: int, steps: int):
        self.cfg, self.pool, self.states, self.sampler = cfg, pool, states, sampler
        self.next, self.steps = start, steps
        self.queue: deque = deque()  # (step, pool batch, sampler position after it)

    def fill(self, step: int) -> None:
        """Submit the batches of ``step`` and of the next ``grpo.max_staleness`` steps."""
        from escrag.seeds import derive_seed

        last = min(self.steps, step + 1 + self.cfg.grpo.max_staleness)
        while self.next < last:
            batch = [self.states[i] for i in self.sampler.next_batch()]
            seeds = [derive_seed(self.cfg.run.seed, "grpo", self.next, s.state_id) for s in batch]
            self.queue.append((self.next, self.pool.submit(batch, seeds), self.sampler.state_dict()))
            self.next += 1

    def take(self, step: int) -> tuple[list, list, dict]:
        """(groups, chunk refs, sampler position after the batch) of ``step``, once generated."""
        queued, batch, position = self.queue.popleft()
        assert queued == step, (queued, step)
        groups, refs = self.pool.collect(batch)
        return groups, refs, position


GROUP_TIMES = ("stage1_s", "retrieve_s", "stage2_s", "reward_s", "risk_s")


def step_row(step: int, groups, m: dict, times: dict, position: dict, version: int, restarts: dict) -> dict:
    """The metrics line of a step: the learner's metrics, the rollout's, timings and data position.
    ``gen_s`` is the longest worker call of the step (generation, retrieval and reward), ``wait_s`` how
    long the driver waited for the step's rollouts (at k > 0 partly hidden behind the last update),
    ``push_s`` until every worker holds the new weights (at k > 0 after the call it is running),
    ``step_s`` the wall time since the previous step ended. ``GROUP_TIMES`` are the slowest group's
    parts of ``gen_s`` (``rollout.episode.run_group``; groups of a worker share its engine, so they
    overlap): stage 1 (queueing for the engine included), retrieval, stage 2, reward, crisis check."""
    gen_tokens = sum(g.stats.get("stage1_tokens", 0) + g.stats.get("stage2_tokens", 0) for g in groups)
    gen_s = max((g.stats.get("batch_s", 0.0) for g in groups), default=0.0)
    parts = {k: max(g.stats[k] for g in groups) for k in GROUP_TIMES if groups and all(k in g.stats for g in groups)}
    return {"step": step, **m, "gen_s": gen_s, **parts, **times, "gen_tokens": gen_tokens,
            "gen_tokens_per_s": gen_tokens / max(gen_s, 1e-9),
            "samples_per_s": sum(len(g.samples) for g in groups) / max(times["step_s"], 1e-9), "version": version,
            "epoch": position["epoch"], "data_index": position["index"], "time": time.time(),
            **{f"restarts_{name}": n for name, n in restarts.items()}, **stage1_format(groups)}


def stage1_format(groups, prefix: str = "") -> dict:
    """With RAG, the share of stage-1 answers ĉ that parse (and so carry a response block for the
    query): ``{"stage1_format_mean": share}``; {} for vanilla rollouts."""
    samples = [s for g in groups for s in g.samples if s.initial_output]
    return {f"{prefix}stage1_format_mean": sum(s.stage1_format_ok for s in samples) / len(samples)} if samples else {}


def sample_rows(step: int, groups) -> list[dict]:
    """What was sampled at a step, one row per group (``samples.jsonl``)."""
    return [{"step": step, "state_id": g.state_id, "version": g.policy_version,
             "outputs": [s.output for s in g.samples], "initial_outputs": [s.initial_output for s in g.samples],
             "exemplar_ids": [s.exemplar_ids for s in g.samples], "rewards": g.rewards,
             "rm_scores": [s.rm_score for s in g.samples], "format_rewards": [s.format_reward for s in g.samples]}
            for g in groups]


def _resume(cfg: Config, learner, sampler, pool, log) -> int:
    import ray

    from trainer.checkpoint import load_latest

    found = load_latest(output_path(cfg, "checkpoints"))
    if found is None:
        log("[job] --resume: no checkpoint yet, starting at step 0")
        return 0
    learner_state, state = found
    ray.get(learner.load_state_dict.remote(learner_state))
    sampler.load_state_dict(state["sampler"])
    version = int(learner_state["version"])
    if version > 0:
        pool.push_weights(ray.get(learner.publish.remote()), version)
    log(f"[job] resumed from step {state['step']} (epoch {sampler.epoch}, index {sampler.index}, "
        f"weights version {version})")
    return int(state["step"])


def _checkpoint(cfg: Config, step: int, learner, position: dict) -> None:
    """Checkpoint after ``step`` with the sampler ``position`` after that step's batch (batches
    generated ahead are not part of it: a resume draws them again)."""
    import ray

    from trainer.checkpoint import save_checkpoint

    state = ray.get(learner.state_dict.remote())
    save_checkpoint(output_path(cfg, "checkpoints"), step, state, {"sampler": position, "version": state["version"]},
                    cfg.grpo.keep_checkpoints)


def _step(step: int, ahead: Lookahead, pool, learner, restarts, since: float) -> tuple[dict, list, dict]:
    """One step of Algorithm 1: submit the rollouts of this step and the next k, wait for this
    step's, update, push the weights. Returns (metrics row, groups, sampler position after the
    step's batch)."""
    import ray

    ahead.fill(step)
    t0 = time.perf_counter()
    groups, refs, position = ahead.take(step)
    t1 = time.perf_counter()
    m, version, weights = ray.get(learner.train.remote(*refs))
    t2 = time.perf_counter()
    if weights is not None:
        pool.push_weights(weights, version)
    t3 = time.perf_counter()
    times = {"wait_s": t1 - t0, "train_call_s": t2 - t1, "push_s": t3 - t2, "step_s": t3 - since}
    return step_row(step + 1, groups, m, times, position, version, restarts()), groups, position


def fit(cfg: Config, pool, learner, states: list, resume: bool = False, log=print, restarts=dict) -> dict:
    """The loop of Algorithm 1 (training part) with ``learner`` a ``LearnerActor`` handle; returns a
    summary with the metrics rows' path. ``restarts()`` reports the job's service restarts."""
    from escrag.progress import progress_bar
    from trainer.metrics import MetricsLog, StepLog

    g = cfg.grpo
    sampler = StateSampler(len(states), g.batch_states, cfg.run.seed)
    start = done = _resume(cfg, learner, sampler, pool, log) if resume else 0
    steps = total_steps(cfg.grpo, len(states))
    resume_step = start if resume else None
    metrics = MetricsLog(cfg.run.output_dir, resume_step, tensorboard=g.tensorboard)
    samples = StepLog(output_path(cfg, "samples.jsonl"), resume_step) if g.log_samples else None
    ahead, position = Lookahead(cfg, pool, states, sampler, start, steps), sampler.state_dict()
    held_out = eval_states(cfg)
    bar = progress_bar(range(start, steps), desc="grpo", unit="step", file=sys.stderr, initial=start, total=steps)
    since = time.perf_counter()
    try:
        for step in bar:
            row, groups, position = _step(step, ahead, pool, learner, restarts, since)
            since, done = time.perf_counter(), step + 1
            if held_out and done % g.eval_every == 0:
                row.update(evaluate(cfg, pool, held_out, done, log))
            metrics.write(row)
            for r in sample_rows(done, groups) if samples else ():
                samples.write(r)
            bar.set_postfix(reward=f"{row.get('reward_mean', 0):.3f}", kl=f"{row.get('kl', 0):.4f}")
            if done % g.log_every == 0:
                log(f"[grpo] step {done}/{steps} reward {row.get('reward_mean', 0):.3f} "
                    f"(format {row.get('format_mean', 0):.2f}) kl {row.get('kl', 0):.4f} zero-adv groups "
                    f"{row['zero_adv_groups']}/{row['groups']} stale {row['stale_groups']} gen {row['gen_s']:.1f}s "
                    f"wait {row['wait_s']:.1f}s update {row['update_s']:.1f}s step {row['step_s']:.1f}s")
            if done % g.checkpoint_every == 0 or done == steps:
                _checkpoint(cfg, done, learner, position)
    except ServiceError as exc:
        _checkpoint(cfg, done, learner, position)
        cause = str(getattr(exc, "cause", None) or exc).strip().splitlines()[-1]
        raise ServiceError(f"{cause}; stopped after step {done} of {steps} with a checkpoint in "
                           f"{output_path(cfg, 'checkpoints')}: rerun with --resume once the service is back") from None
    finally:
        metrics.close()
    return {"steps": steps, "start": start, "metrics": str(metrics.path)}
