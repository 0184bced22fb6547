"""Reward-model training as a job: ``python -m ray_jobs.train_rm --config FILE`` (also the entrypoint
of ``ray job submit -- python -m ray_jobs.train_rm --config FILE``).

Owns: choosing the pairs file and the output folder from the config, then calling
``reward_server.train.train_reward_model``. Pairs: ``--pairs``, else ``reward.pairs``, else silver
pairs bootstrapped from ESConv train into ``run_paths(cfg).pairs`` (reused when it
exists). Output: ``--out``, else ``reward.head_dir``, else ``<output_dir>/rm``.

By default the work runs in this process (the head trains in seconds once features are cached; a
driver under ``ray job submit`` is already on the cluster). ``--ray`` runs it as one Ray task instead,
e.g. to place it on a GPU node: it joins ``ray.address`` / ``RAY_ADDRESS`` or starts a local Ray.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from escrag.config import load_config, output_path, run_paths
from escrag.errors import run_main


def resolve_pairs(cfg, pairs: str | None = None) -> Path:
    """The pairs file to train on: ``--pairs``, else the pipeline's pairs stage (``reward.pairs``, or
    silver pairs bootstrapped once into ``run_paths(cfg).pairs``)."""
    if pairs:
        return Path(pairs)
    path = run_paths(cfg).pairs
    if not path.is_file():
        from ray_jobs.pipeline import make_pairs

        make_pairs(cfg)
    return path


def run(cfg, pairs: Path, out: Path, use_ray: bool = False) -> dict:
    from reward_server.train import train_reward_model

    if not use_ray:
        return train_reward_model(cfg, pairs, out)
    from escrag.raylocal import init_ray

    address = cfg.ray.address or os.environ.get("RAY_ADDRESS")
    ray = init_ray(address, None if address else cfg.ray.num_cpus,
                   cfg.ray.tmpdir or str(output_path(cfg, "ray")))
    task = ray.remote(num_cpus=1)(train_reward_model)
    return ray.get(task.remote(cfg, str(Path(pairs).resolve()), str(Path(out).resolve())))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ray_jobs.train_rm", description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/cpu-demo.yaml")
    p.add_argument("-o", "--override", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--pairs", default=None, help="pairs JSONL (default: reward.pairs, else silver pairs)")
    p.add_argument("--out", default=None, help="head folder (default: reward.head_dir or <output_dir>/rm)")
    p.add_argument("--ray", action="store_true", help="run the training as a Ray task")
    args = p.parse_args(argv)

    def job() -> int:
        cfg = load_config(args.config, args.override)
        out = Path(args.out or run_paths(cfg).rm)
        metrics = run(cfg, resolve_pairs(cfg, args.pairs), out, args.ray)
        print(json.dumps({k: v for k, v in metrics.items() if k != "epochs"}, indent=2))
        return 0

    return run_main("train_rm", job)


if __name__ == "__main__":
    sys.exit(main())
