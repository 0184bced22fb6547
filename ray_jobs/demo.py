"""The embedded demo that ``make demo`` runs: every stage of ESCRAG-R1 on the embedded default.

Owns: the order of the stages and what is printed between them. Each stage calls the module that
owns the work; stages whose output already exists in ``run.output_dir`` are reused, so a second run
resumes instead of starting over.
"""

from __future__ import annotations

import argparse
import sys
import time

from escrag.config import load_config


def banner(step: str) -> float:
    print(f"\n=== {step} ===", flush=True)
    return time.time()


def stage_data(cfg) -> None:
    from escrag.data import SPLITS, split_stats

    for split in SPLITS:
        s = split_stats(split)
        print(f"{split}: {s['dialogues']} dialogues, {s['states']} dialogue states")


def stage_models(cfg) -> None:
    from escrag.models import resolve_model

    for spec in sorted({cfg.policy.model, cfg.reward.backbone, cfg.retriever.embedder}):
        print(f"{spec} -> {resolve_model(spec)}")


STAGES = [("ESConv dialogue states", stage_data), ("models (converted once, then cached)", stage_models)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ray_jobs.demo", description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/cpu-demo.yaml")
    p.add_argument("-o", "--override", action="append", default=[])
    args = p.parse_args(argv)
    cfg = load_config(args.config, args.override)
    start = time.time()
    for name, stage in STAGES:
        t0 = banner(name)
        stage(cfg)
        print(f"({time.time() - t0:.1f} s)")
    print(f"\ndemo finished in {time.time() - start:.0f} s; outputs under {cfg.run.output_dir}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
