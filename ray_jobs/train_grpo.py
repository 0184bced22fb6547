"""Retrieval-augmented GRPO on one machine (paper 3.3, Algorithm 1 lines 3-17): the main training job.

    python -m ray_jobs.train_grpo --config configs/cpu-demo.yaml [--resume] [-o key=value ...]
    escrag grpo --config ...            (same job)
    ray job submit --address http://127.0.0.1:8265 --working-dir . -- \\
        .venv/bin/python -m ray_jobs.train_grpo --config configs/cpu-test.yaml

Owns: the wiring of the job. It starts Ray (or joins it: ``ray.address``, or ``RAY_ADDRESS`` which
``ray job submit`` sets), makes the placement plan (``trainer.placement``: logged, written to
``placement.json``, and the job stops before any server or actor starts when it does not fit), starts
the retriever and reward servers on the GPUs the plan gives them unless ``retriever.url`` /
``reward.url`` are given, places the learner and the rollout engines on the cluster's GPUs
(``trainer.learner.place``), starts the rollout workers (``rollout.pool.RolloutPool``) and the learner
actor (``trainer.learner.LearnerActor``), and runs the loop (``trainer.loop.fit``: steps, checkpoints,
resume, validation, metrics); at the end the merged policy is saved to ``<output_dir>/policy`` and the
reward/KL curves to ``<output_dir>/reward_curve.png``. ``--backend openrlhf`` hands the loop to
OpenRLHF (``trainer/openrlhf/``, ``train_openrlhf``); ``--dry-run`` prints the plan (and, for OpenRLHF,
writes the prompt files and prints the command) without starting anything.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import yaml

from escrag.atomic import write_text
from escrag.config import Config, load_config, output_path, to_dict
from escrag.errors import run_main
from trainer.loop import eval_states, fit, train_states
from trainer.sampler import total_steps


def write_resolved_config(cfg: Config) -> Path:
    """The job's config after overrides, for the servers it starts and for the record."""
    return write_text(output_path(cfg, "config.yaml"), yaml.safe_dump(to_dict(cfg), sort_keys=False))


def start_ray(cfg: Config):
    from escrag.raylocal import init_ray

    address = cfg.ray.address or os.environ.get("RAY_ADDRESS")
    tmpdir = None if address else (cfg.ray.tmpdir or str(output_path(cfg, "ray")))
    return init_ray(address, cfg.ray.num_cpus, tmpdir)


def _placement(cfg: Config, learner, log) -> None:
    import ray

    info, ro = ray.get(learner.describe.remote()), cfg.rollout
    log(f"[job] learner actor on {info['device']} ({info['threads']} torch threads, Ray resources "
        f"{info['resources']}); {ro.num_workers} rollout worker(s), each {ro.worker_cpus} CPU and "
        f"{ro.worker_gpus} GPU ({ro.engine} engine{', ' + ro.device if ro.engine == 'transformers' else ''}); "
        f"max_staleness {cfg.grpo.max_staleness}")


def job_plan(cfg: Config, ray_gpus: float | None = None, log=print):
    """The placement plan of the run (``trainer.placement``): logged as a table, written to
    ``<output_dir>/placement.json`` (also when it does not fit), and required to fit."""
    from trainer.placement import plan_for

    plan = plan_for(cfg, ray_gpus)
    log(plan.table())
    log(f"[job] placement plan: {plan.write(output_path(cfg, 'placement.json'))}")
    return plan.require()


def train(cfg: Config, resume: bool = False, log=print) -> dict:
    """Run the whole job; returns {"steps", "metrics", "policy", "plot"}."""
    import ray

    from ray_jobs.services import JobServices
    from rollout.engines.vllm_engine import check_config
    from rollout.pool import RolloutPool
    from trainer.learner import place, start_learner
    from trainer.metrics import plot_curves, read_metrics
    from trainer.placement import service_devices

    check_config(cfg)  # a vLLM this environment cannot run: refused before Ray, servers or actors start
    out = Path(cfg.run.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    config_file = write_resolved_config(cfg)
    states = train_states(cfg)
    log(f"[job] {len(states)} train states, {total_steps(cfg.grpo, len(states))} steps of "
        f"{cfg.grpo.batch_states} states x {cfg.rollout.group_size} samples; outputs in {out}/")
    start_ray(cfg)
    gpus = ray.cluster_resources().get("GPU", 0.0)
    devices = service_devices(job_plan(cfg, gpus, log))
    with JobServices(cfg, config_file, out / "logs", need_retriever=cfg.rollout.rag, log=log, devices=devices) as svc:
        cfg = place(cfg, gpus)
        learner = start_learner(cfg)
        pool = RolloutPool(cfg, svc.urls["retriever"], svc.urls["reward"])
        try:
            _placement(cfg, learner, log)
            summary = fit(cfg, pool, learner, states, resume=resume, log=log, restarts=lambda: svc.restarts)
            meta = {"stage": "grpo", "steps": summary["steps"]}
            summary["policy"] = str(ray.get(learner.save_policy.remote(str(out.resolve() / "policy"), meta)))
        finally:
            pool.shutdown()
            ray.kill(learner, no_restart=True)
    rows = read_metrics(summary["metrics"])
    summary["plot"] = str(plot_curves(rows, out / "reward_curve.png")) if rows else None
    log(f"[job] done: policy {summary['policy']}, metrics {summary['metrics']}, plot {summary['plot']}")
    return summary


def train_openrlhf(cfg: Config, policy: str | None = None, resume: bool = False, dry_run: bool = False,
                   tokenizer: str | None = None, log=print) -> int:
    """``--backend openrlhf``: OpenRLHF's Ray GRPO trainer driving the two-stage agent from the SFT
    model (``policy``, default ``<output_dir>/sft``), after the placement plan; ``dry_run`` writes the
    plan and the prompt files, prints the command and returns."""
    from trainer.openrlhf import launch as orl
    from trainer.placement import service_devices

    policy = str(policy or orl.default_policy(cfg))
    devices = service_devices(job_plan(cfg, log=log))
    cmd, env = orl.command(cfg, policy, resume), orl.run_env(cfg)
    if dry_run:
        files = orl.write_prompts(cfg, train_states(cfg), orl.prompt_tokenizer(cfg, policy, tokenizer, log), orl.UNSET_URL,
                                  orl.UNSET_URL, resume=resume, eval_states=eval_states(cfg))
        for path, rows in files:
            log(f"[dry-run] {path}: {rows} rows")
        print(orl.one_line(cmd, env))
        return 0
    from escrag.models import load_tokenizer
    from ray_jobs.services import JobServices

    orl.require_policy(cfg, policy)
    out = Path(cfg.run.output_dir)
    with JobServices(cfg, write_resolved_config(cfg), out / "logs", need_retriever=cfg.rollout.rag, log=log,
                     devices=devices) as svc:
        orl.write_prompts(cfg, train_states(cfg), load_tokenizer(policy), svc.urls["retriever"], svc.urls["reward"],
                          resume=resume, eval_states=eval_states(cfg))
        return orl.run(cmd, env, log=log)


def dry_run_local(cfg: Config) -> int:
    """``--dry-run`` of the local backend: the placement plan for ``placement.gpus`` (none: the CPU)."""
    job_plan(cfg, log=print)
    return 0


def run_cli(args) -> int:
    """Handler of ``escrag grpo``."""
    import dataclasses

    overrides = [*args.override, *([f"placement.gpus={args.gpus}"] if getattr(args, "gpus", None) else [])]
    cfg = load_config(args.config, overrides)
    if getattr(args, "backend", None):
        cfg = dataclasses.replace(cfg, grpo=dataclasses.replace(cfg.grpo, backend=args.backend))
    if cfg.grpo.backend == "openrlhf":
        return train_openrlhf(cfg, args.policy, args.resume, args.dry_run, getattr(args, "tokenizer", None))
    if args.dry_run:
        return dry_run_local(cfg)
    train(cfg, resume=args.resume)
    return 0


def backend_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", choices=("local", "openrlhf"), default=None,
                   help="local: this machine's learner; openrlhf: OpenRLHF on a GPU cluster (docs/cluster.md); "
                        "default: grpo.backend")
    p.add_argument("--policy", default=None, help="openrlhf: start from this model (default <output_dir>/sft)")
    p.add_argument("--dry-run", action="store_true",
                   help="print the placement plan and write <output_dir>/placement.json; openrlhf: also write the "
                        "prompt files and print the command on its last line; then exit")
    p.add_argument("--gpus", default=None, metavar="NxGiB",
                   help='the GPUs to plan for, e.g. 2x80 (= -o placement.gpus=2x80; the paper presets name theirs)')
    p.add_argument("--tokenizer", default=None, metavar="SPEC",
                   help="--dry-run: render the prompt file with this tokenizer (default: the policy's when it is "
                        "on this machine, else SmolLM2's as an estimate)")


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
