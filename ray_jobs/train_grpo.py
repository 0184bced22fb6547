"""Retrieval-augmented GRPO on one machine (paper 3.3, Algorithm 1 lines 3-17): the main training job.

    python -m ray_jobs.train_grpo --config configs/cpu-demo.yaml [--resume] [-o key=value ...]
    escrag grpo --config ...            (same job)
    ray job submit --address http://127.0.0.1:8265 --working-dir . -- \\
        .venv/bin/python -m ray_jobs.train_grpo --config configs/cpu-test.yaml

Owns: the training loop. It starts Ray (or joins it: ``ray.address``, or ``RAY_ADDRESS`` which
``ray job submit`` sets), starts the retriever and reward servers unless ``retriever.url`` /
``reward.url`` are given, starts the rollout workers (``rollout.pool.RolloutPool``) and the learner
(``trainer.learner.Learner``), then per step: sample ``grpo.batch_states`` train states -> scored groups
from the workers -> one learner update -> push the new weights (with their version) to every worker.
Every ``grpo.checkpoint_every`` steps an atomic checkpoint; per-step metrics go to
``<output_dir>/metrics.jsonl`` and TensorBoard; at the end the merged policy is saved to
``<output_dir>/policy`` and the reward/KL curves to ``<output_dir>/reward_curve.png``.

Departures from the paper (see trainer/grpo.py for the loss): the learner runs in this driver process
(one machine), rollouts and updates alternate (fully on-policy, no overlap); the paper's batch of 128
states and 2 epochs are config values (``grpo.batch_states``, ``grpo.epochs`` or ``grpo.steps``).
"""

from __future__ import annotations

import argparse
import math
import os
import random
import sys
import time
from pathlib import Path

import yaml

from escrag.atomic import write_text
from escrag.config import Config, load_config, output_path, to_dict
from escrag.errors import ServiceError, run_main


def train_states(cfg: Config) -> list:
    """The train dialogue states, subsampled (seeded) to ``data.max_train_states``."""
    from escrag.data import load_states

    states = load_states(cfg.data.train)
    k = cfg.data.max_train_states
    if k and k < len(states):
        states = random.Random(cfg.run.seed).sample(states, k)
    return states


def total_steps(cfg: Config, n_states: int) -> int:
    g = cfg.grpo
    return g.steps or math.ceil(g.epochs * n_states / g.batch_states)


def write_resolved_config(cfg: Config) -> Path:
    """The job's config after overrides, for the servers it starts and for the record."""
    return write_text(output_path(cfg, "config.yaml"), yaml.safe_dump(to_dict(cfg), sort_keys=False))


def start_ray(cfg: Config):
    from escrag.raylocal import init_ray

    address = cfg.ray.address or os.environ.get("RAY_ADDRESS")
    tmpdir = None if address else (cfg.ray.tmpdir or str(output_path(cfg, "ray")))
    return init_ray(address, cfg.ray.num_cpus, tmpdir)


def step_row(step: int, groups, m: dict, gen_s: float, push_s: float, sampler, version: int,
             restarts: dict) -> dict:
    gen_tokens = sum(g.stats.get("stage1_tokens", 0) + g.stats.get("stage2_tokens", 0) for g in groups)
    samples = [s for g in groups for s in g.samples if s.initial_output]
    row = {"step": step, **m, "gen_s": gen_s, "push_s": push_s, "gen_tokens": gen_tokens,
           "gen_tokens_per_s": gen_tokens / max(gen_s, 1e-9), "version": version,
           "epoch": sampler.epoch, "data_index": sampler.index, "time": time.time(),
           **{f"restarts_{name}": n for name, n in restarts.items()}}
    if samples:  # RAG: the share of ĉ that parses (and so carries a response block for the query)
        row["stage1_format_mean"] = sum(s.stage1_format_ok for s in samples) / len(samples)
    return row


def sample_rows(step: int, groups) -> list[dict]:
    """What was sampled at a step, one row per group (``samples.jsonl``)."""
    return [{"step": step, "state_id": g.state_id, "version": g.policy_version,
             "outputs": [s.output for s in g.samples], "initial_outputs": [s.initial_output for s in g.samples],
             "exemplar_ids": [s.exemplar_ids for s in g.samples], "rewards": g.rewards,
             "rm_scores": [s.rm_score for s in g.samples], "format_rewards": [s.format_reward for s in g.samples]}
            for g in groups]


def _resume(cfg: Config, learner, sampler, pool, log) -> int:
    from trainer.checkpoint import load_latest

    found = load_latest(output_path(cfg, "checkpoints"))
    if found is None:
        log("[job] --resume: no checkpoint yet, starting at step 0")
        return 0
    learner_state, state = found
    learner.load_state_dict(learner_state)
    sampler.load_state_dict(state["sampler"])
    if learner.version > 0:
        pool.push_weights(learner.export_weights(), learner.version)
    log(f"[job] resumed from step {state['step']} (epoch {sampler.epoch}, index {sampler.index}, "
        f"weights version {learner.version})")
    return int(state["step"])


def _checkpoint(cfg: Config, step: int, learner, sampler) -> None:
    from trainer.checkpoint import save_checkpoint

    save_checkpoint(output_path(cfg, "checkpoints"), step, learner.state_dict(),
                    {"sampler": sampler.state_dict(), "version": learner.version}, cfg.grpo.keep_checkpoints)


def _step(cfg: Config, step: int, pool, learner, states: list, sampler, restarts) -> tuple[dict, list]:
    """One step of Algorithm 1: sample states, rollouts, update, push weights. Returns (metrics row,
    groups). A failure leaves the sampler where it was, so a checkpoint taken then redoes this step."""
    from escrag.seeds import derive_seed

    before = sampler.state_dict()
    batch = [states[i] for i in sampler.next_batch()]
    t0 = time.perf_counter()
    try:
        groups = pool.generate(batch, [derive_seed(cfg.run.seed, "grpo", step, s.state_id) for s in batch])
    except BaseException:
        sampler.load_state_dict(before)
        raise
    gen_s = time.perf_counter() - t0
    m = learner.step(groups)
    t1 = time.perf_counter()
    if m["optimizer_steps"]:
        pool.push_weights(learner.export_weights(), learner.version)
    return step_row(step + 1, groups, m, gen_s, time.perf_counter() - t1, sampler, learner.version,
                    restarts()), groups


def fit(cfg: Config, pool, learner, states: list, resume: bool = False, log=print, restarts=dict) -> dict:
    """The loop of Algorithm 1 (training part); returns a summary with the metrics rows' path.
    ``restarts()`` reports the job's service restarts for the metrics."""
    from tqdm import tqdm

    from trainer.checkpoint import StateSampler
    from trainer.metrics import MetricsLog, StepLog

    g = cfg.grpo
    sampler = StateSampler(len(states), g.batch_states, cfg.run.seed)
    start = done = _resume(cfg, learner, sampler, pool, log) if resume else 0
    steps = total_steps(cfg, len(states))
    resume_step = start if resume else None
    metrics = MetricsLog(cfg.run.output_dir, resume_step, tensorboard=g.tensorboard)
    samples = StepLog(output_path(cfg, "samples.jsonl"), resume_step) if g.log_samples else None
    bar = tqdm(range(start, steps), desc="grpo", unit="step", file=sys.stderr, initial=start, total=steps)
    try:
        for step in bar:
            row, groups = _step(cfg, step, pool, learner, states, sampler, restarts)
            done = step + 1
            metrics.write(row)
            for r in sample_rows(done, groups) if samples else ():
                samples.write(r)
            bar.set_postfix(reward=f"{row.get('reward_mean', 0):.3f}", kl=f"{row.get('kl', 0):.4f}")
            if done % g.log_every == 0:
                log(f"[grpo] step {done}/{steps} reward {row.get('reward_mean', 0):.3f} "
                    f"(format {row.get('format_mean', 0):.2f}) kl {row.get('kl', 0):.4f} zero-adv groups "
                    f"{row['zero_adv_groups']}/{row['groups']} gen {row['gen_s']:.1f}s update {row['update_s']:.1f}s")
            if done % g.checkpoint_every == 0 or done == steps:
                _checkpoint(cfg, done, learner, sampler)
    except ServiceError as exc:
        _checkpoint(cfg, done, learner, sampler)
        cause = str(getattr(exc, "cause", None) or exc).strip().splitlines()[-1]
        raise ServiceError(f"{cause}; stopped after step {done} of {steps} with a checkpoint in "
                           f"{output_path(cfg, 'checkpoints')}: rerun with --resume once the service is back") from None
    finally:
        metrics.close()
    return {"steps": steps, "start": start, "metrics": str(metrics.path)}


def train(cfg: Config, resume: bool = False, log=print) -> dict:
    """Run the whole job; returns {"steps", "metrics", "policy", "plot"}."""
    from ray_jobs.services import JobServices
    from rollout.pool import RolloutPool
    from trainer.learner import Learner
    from trainer.metrics import plot_curves, read_metrics

    out = Path(cfg.run.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    config_file = write_resolved_config(cfg)
    states = train_states(cfg)
    log(f"[job] {len(states)} train states, {total_steps(cfg, len(states))} steps of "
        f"{cfg.grpo.batch_states} states x {cfg.rollout.group_size} samples; outputs in {out}/")
    with JobServices(cfg, config_file, out / "logs", need_retriever=cfg.rollout.rag, log=log) as svc:
        start_ray(cfg)
        learner = Learner(cfg)
        pool = RolloutPool(cfg, svc.urls["retriever"], svc.urls["reward"])
        try:
            summary = fit(cfg, pool, learner, states, resume=resume, log=log, restarts=lambda: svc.restarts)
        finally:
            pool.shutdown()
    summary["policy"] = str(learner.save_policy(out / "policy", meta={"stage": "grpo", "steps": summary["steps"]}))
    rows = read_metrics(summary["metrics"])
    summary["plot"] = str(plot_curves(rows, out / "reward_curve.png")) if rows else None
    log(f"[job] done: policy {summary['policy']}, metrics {summary['metrics']}, plot {summary['plot']}")
    return summary


def train_openrlhf(cfg: Config, policy: str | None = None, resume: bool = False, dry_run: bool = False,
                   log=print) -> int:
    """``--backend openrlhf``: OpenRLHF's Ray GRPO trainer driving the two-stage agent from the SFT
    model (``policy``, default ``<output_dir>/sft``); ``dry_run`` prints the command and returns."""
    from trainer import openrlhf_launch as orl

    policy = str(policy or orl.default_policy(cfg))
    cmd, env = orl.command(cfg, policy, resume), orl.run_env(cfg)
    if dry_run:
        print(orl.one_line(cmd, env))
        return 0
    from escrag.models import load_tokenizer
    from ray_jobs.services import JobServices

    orl.require_policy(cfg, policy)
    out = Path(cfg.run.output_dir)
    with JobServices(cfg, write_resolved_config(cfg), out / "logs", need_retriever=cfg.rollout.rag, log=log) as svc:
        orl.write_prompts(cfg, train_states(cfg), load_tokenizer(policy), svc.urls["retriever"], svc.urls["reward"])
        return orl.run(cmd, env, log=log)


def run_cli(args) -> int:
    """Handler of ``escrag grpo``."""
    cfg = load_config(args.config, args.override)
    if (getattr(args, "backend", None) or cfg.grpo.backend) == "openrlhf":
        return train_openrlhf(cfg, args.policy, args.resume, args.dry_run)
    train(cfg, resume=args.resume)
    return 0


def backend_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", choices=("local", "openrlhf"), default=None,
                   help="local: this machine's learner; openrlhf: OpenRLHF on a GPU cluster (docs/cluster.md); "
                        "default: grpo.backend")
    p.add_argument("--policy", default=None, help="openrlhf: start from this model (default <output_dir>/sft)")
    p.add_argument("--dry-run", action="store_true", help="openrlhf: print the command on one line and exit")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ray_jobs.train_grpo", description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/cpu-demo.yaml", help="YAML preset (configs/*.yaml)")
    p.add_argument("-o", "--override", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    backend_args(p)
    args = p.parse_args(argv)
    return run_main("train_grpo", lambda: run_cli(args))


if __name__ == "__main__":
    sys.exit(main())
