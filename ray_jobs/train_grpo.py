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
from escrag.errors import run_main


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


def step_row(step: int, groups, m: dict, gen_s: float, push_s: float, sampler, version: int) -> dict:
    gen_tokens = sum(g.stats.get("stage1_tokens", 0) + g.stats.get("stage2_tokens", 0) for g in groups)
    return {"step": step, **m, "gen_s": gen_s, "push_s": push_s, "gen_tokens": gen_tokens,
            "gen_tokens_per_s": gen_tokens / max(gen_s, 1e-9), "version": version,
            "epoch": sampler.epoch, "data_index": sampler.index, "time": time.time()}


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


def fit(cfg: Config, pool, learner, states: list, resume: bool = False, log=print) -> dict:
    """The loop of Algorithm 1 (training part); returns a summary with the metrics rows' path."""
    from tqdm import tqdm

    from escrag.sampling import derive_seed
    from rollout.episode import state_id
    from trainer.checkpoint import StateSampler, save_checkpoint
    from trainer.metrics import MetricsLog

    g = cfg.grpo
    sampler = StateSampler(len(states), g.batch_states, cfg.run.seed)
    start = _resume(cfg, learner, sampler, pool, log) if resume else 0
    steps = total_steps(cfg, len(states))
    metrics = MetricsLog(cfg.run.output_dir, resume_step=start if resume else None, tensorboard=g.tensorboard)
    bar = tqdm(range(start, steps), desc="grpo", unit="step", file=sys.stderr, initial=start, total=steps)
    for step in bar:
        batch = [states[i] for i in sampler.next_batch()]
        t0 = time.perf_counter()
        groups = pool.generate(batch, [derive_seed(cfg.run.seed, "grpo", step, state_id(s)) for s in batch])
        gen_s = time.perf_counter() - t0
        m = learner.step(groups)
        t1 = time.perf_counter()
        if m["optimizer_steps"]:
            pool.push_weights(learner.export_weights(), learner.version)
        row = step_row(step + 1, groups, m, gen_s, time.perf_counter() - t1, sampler, learner.version)
        metrics.write(row)
        bar.set_postfix(reward=f"{row.get('reward_mean', 0):.3f}", kl=f"{row.get('kl', 0):.4f}")
        if (step + 1) % g.log_every == 0:
            log(f"[grpo] step {step + 1}/{steps} reward {row.get('reward_mean', 0):.3f} "
                f"(format {row.get('format_mean', 0):.2f}) kl {row.get('kl', 0):.4f} "
                f"zero-adv groups {m['zero_adv_groups']}/{m['groups']} gen {gen_s:.1f}s "
                f"update {m['update_s']:.1f}s")
        if (step + 1) % g.checkpoint_every == 0 or step + 1 == steps:
            save_checkpoint(output_path(cfg, "checkpoints"), step + 1, learner.state_dict(),
                            {"sampler": sampler.state_dict(), "version": learner.version}, g.keep_checkpoints)
    metrics.close()
    return {"steps": steps, "start": start, "metrics": str(metrics.path)}


def train(cfg: Config, resume: bool = False, log=print) -> dict:
    """Run the whole job; returns {"steps", "metrics", "policy", "plot"}."""
    from ray_jobs.services import job_services
    from rollout.pool import RolloutPool
    from trainer.learner import Learner
    from trainer.metrics import plot_curves, read_metrics

    out = Path(cfg.run.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    config_file = write_resolved_config(cfg)
    states = train_states(cfg)
    log(f"[job] {len(states)} train states, {total_steps(cfg, len(states))} steps of "
        f"{cfg.grpo.batch_states} states x {cfg.rollout.group_size} samples; outputs in {out}/")
    with job_services(cfg, config_file, out / "logs", need_retriever=cfg.rollout.rag, log=log) as (ret_url, rew_url):
        start_ray(cfg)
        learner = Learner(cfg)
        pool = RolloutPool(cfg, ret_url, rew_url)
        try:
            summary = fit(cfg, pool, learner, states, resume=resume, log=log)
        finally:
            pool.shutdown()
    summary["policy"] = str(learner.save_policy(out / "policy", meta={"stage": "grpo", "steps": summary["steps"]}))
    rows = read_metrics(summary["metrics"])
    summary["plot"] = str(plot_curves(rows, out / "reward_curve.png")) if rows else None
    log(f"[job] done: policy {summary['policy']}, metrics {summary['metrics']}, plot {summary['plot']}")
    return summary


def run_cli(args) -> int:
    """Handler of ``escrag grpo``."""
    cfg = load_config(args.config, args.override)
    train(cfg, resume=args.resume)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ray_jobs.train_grpo", description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/cpu-demo.yaml", help="YAML preset (configs/*.yaml)")
    p.add_argument("-o", "--override", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    args = p.parse_args(argv)
    return run_main("train_grpo", lambda: run_cli(args))


if __name__ == "__main__":
    sys.exit(main())
