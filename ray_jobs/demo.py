"""The embedded demo that ``make demo`` runs: the pipeline job on the embedded default, then answers.

    python -m ray_jobs.demo --config configs/cpu-demo.yaml [-o key=value ...]
    python -m ray_jobs.demo --config FILE --compare-only [--split valid|test]   # only SFT vs GRPO

Owns: what is printed around the pipeline (``ray_jobs.pipeline``: silver pairs -> exemplar index ->
reward head -> cold-start SFT -> retrieval-augmented GRPO with LoRA, each stage skipped when it is
up to date, an interrupted GRPO stage resumed from its last checkpoint), then RAG inference with the
trained policy on held-out test states, printed with their rewards, the reward curve, and the SFT
and GRPO policies answering one fixed set of valid or test states with the same seeds, every answer
saved and scored apart by format, RM (all answers and those parsing in both) and strategy accuracy
(``evaluation.compare``).

Its first line names the CPU class found here (``escrag.models.cpu_class``), the dtypes, the sizes that
class runs (configs/cpu-demo-classes.yaml: the float32 classes run fewer steps and states) and the time
a fresh-clone demo took on it (bench/results/wall_times.json); a machine more than 1.5x slower than that
on the first timed stage is told so once.

Departures from the paper, for a 2-core CPU: SmolLM2-135M instead of Qwen2.5-3B/7B,
all-MiniLM-L6-v2 instead of bge-m3, ESConv turns instead of ESC-Preference as the exemplar corpus,
silver pairs (gold turn vs a corrupted one) instead of ESC-Preference for the reward head, bootstrapped
SFT demonstrations instead of GPT-4o ones, and a few GRPO steps instead of 2 epochs of 128 states.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from pathlib import Path

from escrag.config import Config, load_config, run_paths
from escrag.errors import run_main


def banner(step: str) -> float:
    print(f"\n=== {step} ===", flush=True)
    return time.time()


ROOT = Path(__file__).resolve().parent.parent
WALL_TIMES = ROOT / "bench" / "results" / "wall_times.json"
CLASS_SIZES = ROOT / "configs" / "cpu-demo-classes.yaml"  # the sizes per CPU class of configs/cpu-demo.yaml
DEFAULT_CONFIG = ROOT / "configs" / "cpu-demo.yaml"
SLOW = 1.5  # a stage this many times slower than the table's says so, once


def class_sizes(cpu: str, path: Path = CLASS_SIZES) -> dict:
    """The demo's overrides on CPU class ``cpu`` (``escrag.models.cpu_class``), key path -> value."""
    import yaml

    return dict(yaml.safe_load(Path(path).read_text()).get(cpu) or {})


def expected_run(cpu: str, path: Path = CLASS_SIZES) -> dict | None:
    """The latest fresh-clone ``make demo`` of bench/results/wall_times.json (the one source the README
    and docs/measurements.md also show) on CPU class ``cpu``, else on a class with the same sizes."""
    try:
        rows = [r for r in json.loads(WALL_TIMES.read_text())["rows"] if r.get("what") == "make demo"]
    except (OSError, ValueError, KeyError):
        return None
    same = [r for r in rows if r.get("cpu_class") == cpu]
    alike = [r for r in rows if r.get("cpu_class") and class_sizes(r["cpu_class"], path) == class_sizes(cpu, path)]
    return (same or alike or [None])[-1]


def compute_note(cfg: Config) -> str:
    """The demo's first line: the CPU class detected here, the dtypes it computes in, the sizes the class
    runs and the time a fresh-clone demo took on that class (``expected_run``)."""
    from escrag.models import cpu_class, engine_dtype
    from escrag.safety.backbone import conv_dtype

    cpu = cpu_class()
    caps = " ".join(f"{k}={os.environ[k]}" for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA") if os.environ.get(k))
    learner = cfg.policy.compute_dtype
    dtypes = (f"learner {learner}, rollout engine {engine_dtype(cfg.rollout.dtype, learner, cfg.rollout.device)}, "
              f"reward backbone {cfg.reward.compute_dtype}, crisis check {conv_dtype(cfg.safety)}")
    sizes = ", ".join(f"{k}={v}" for k, v in class_sizes(cpu).items()) or "configs/cpu-demo.yaml as it is"
    run = expected_run(cpu)
    took = (f"expect ~{round(run['seconds'] / 60)} minutes (a fresh-clone make demo, install included, took "
            f"{run['seconds']} s on {run['machine']})" if run else "no demo measured on this class yet")
    return f"CPU class {cpu}{f' ({caps})' if caps else ''}: {dtypes}; sizes: {sizes}; {took}"


def pace_check(run: dict | None, say=print):
    """A pipeline ``on_stage`` hook: the first stage that ran and that took at least 10 s in ``run``
    (shorter ones are mostly start-up) is held against that time, and if it took more than ``SLOW``
    times as long, ``say`` tells the user once what to expect instead."""
    done = False

    def check(stage: str, summary: dict) -> None:
        nonlocal done
        want = ((run or {}).get("stages_s") or {}).get(stage)
        if done or not want or want < 10:
            return
        done, ratio = True, summary["seconds"] / want
        if ratio > SLOW:
            say(f"note: this machine is slower than the table: {stage} took {summary['seconds']:.0f} s against "
                f"{want} s on {run['machine']} ({ratio:.1f}x); expect the demo to take ~"
                f"{round(run['seconds'] * ratio / 60)} minutes rather than ~{round(run['seconds'] / 60)}")

    return check


def show_data_and_models(cfg: Config) -> None:
    from escrag.data import SPLITS, split_stats
    from escrag.models import resolve_model

    for split in SPLITS:
        s = split_stats(split)
        print(f"{split}: {s['dialogues']} dialogues, {s['states']} dialogue states")
    for spec in sorted({cfg.policy.model, cfg.reward.backbone, cfg.retriever.embedder}):
        print(f"{spec} -> {resolve_model(spec)}")


def show_curve(cfg: Config) -> None:
    from trainer.metrics import read_metrics

    rows = read_metrics(run_paths(cfg).grpo / "metrics.jsonl")
    print("reward curve (step: reward mean ± std | format | stage-1 parses | KL | zero-advantage groups):")
    for r in rows:
        print(f"  {r['step']:3d}: {r.get('reward_mean', 0):+.3f} ± {r.get('reward_std', 0):.3f} | "
              f"{r.get('format_mean', 0):.2f} | {r.get('stage1_format_mean', float('nan')):.2f} | "
              f"{r.get('kl', 0):.5f} | {r.get('zero_adv_groups', 0)}")


def show_answers(cfg: Config, split: str = "test") -> dict | None:
    """Answers to a few held-out test states, then (``run.demo_compare_states``) SFT vs GRPO on a
    fixed set of ``split`` states (valid: to choose a recipe; test: once per reported number); the
    summary goes to ``<grpo>/compare-<split>.json``, every answer beside it (``.jsonl``)."""
    from escrag.atomic import write_json
    from escrag.data import load_states
    from escrag.seeds import derive_seed
    from evaluation.heldout import answer_all, compare_policies, print_compare
    from ray_jobs.pipeline import grpo_config
    from ray_jobs.services import JobServices
    from ray_jobs.train_grpo import write_resolved_config

    gcfg = grpo_config(cfg)
    test = load_states(cfg.data.test)
    states = random.Random(cfg.run.seed).sample(test, cfg.run.demo_examples)
    pool = test if split == "test" else load_states(split)
    fixed = random.Random(f"{cfg.run.seed}/compare").sample(pool, min(cfg.run.demo_compare_states, len(pool)))
    demo = [(s, derive_seed(cfg.run.seed, "demo", s.state_id, 0)) for s in states]
    n = cfg.run.demo_compare_samples  # a comparison seed comes from the state and sample index only
    jobs = [(s, j, derive_seed(cfg.run.seed, "compare", s.state_id, j)) for s in fixed for j in range(n)]
    compare = [(s, seed) for s, _, seed in jobs]
    sft, grpo = str(run_paths(cfg).sft), str(run_paths(cfg).grpo / "policy")
    t0 = time.time()
    with JobServices(gcfg, write_resolved_config(gcfg), run_paths(cfg).grpo / "logs", need_retriever=True) as svc:
        # SFT first, then GRPO's comparison and demo answers in one batch: one engine, one compile
        asks = ([(sft, compare)] if fixed else []) + [(grpo, compare + demo)]
        *first, last = asyncio.run(answer_all(cfg, asks, svc.urls["retriever"], svc.urls["reward"]))
        _print_answers(states, last[len(compare):])
        if not fixed:
            return None
        banner(f"{split}: SFT vs GRPO on {len(fixed)} fixed {split} states x {cfg.run.demo_compare_samples} "
               "answers (same seeds)")
        cmp = compare_policies(cfg, fixed, jobs, {"sft": first[0], "grpo": last[:len(compare)]}, split)
    write_json(run_paths(cfg).grpo / f"compare-{split}.json", cmp)
    print_compare(cmp)
    print(f"({time.time() - t0:.0f} s for the demo answers and the comparison; answers in "
          f"{run_paths(cfg).grpo / f'compare-{split}.jsonl'})")
    return cmp


def _print_answers(states, results) -> None:
    for i, (s, (ans, score)) in enumerate(zip(states, results), 1):
        print(f"\n--- held-out test state {i}: {s.dialogue_id}/{s.turn_index} ({s.emotion}, {s.problem}) ---")
        print(f"client: {s.history[-1]['content']}")
        print(f"think: {ans['think'] or '(output did not parse)'}")
        print(f"exemplars: {[e.get('id') for e in ans['exemplars']]}")
        print(f"counselor: {ans['response']}")
        print(f"gold: {s.target}")
        print(f"reward {score['rewards']:+.3f} = rm {score['rm_scores']:+.3f} + format {score['format_rewards']:.0f}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ray_jobs.demo", description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/cpu-demo.yaml")
    p.add_argument("-o", "--override", action="append", default=[])
    p.add_argument("--split", choices=("valid", "test"), default="test",
                   help="states of the SFT vs GRPO comparison: valid to choose a recipe, test once per reported number")
    p.add_argument("--compare-only", action="store_true",
                   help="skip the pipeline: answer and compare SFT vs GRPO of a finished run of this config")
    p.add_argument("--sizes", help="the per-CPU-class sizes to apply (default: configs/cpu-demo-classes.yaml for "
                                    "configs/cpu-demo.yaml, none for another config); -o overrides come after")
    args = p.parse_args(argv)
    cfg = load_config(args.config, demo_overrides(args.config, args.sizes) + args.override)
    return run_main("demo", lambda: show_answers(cfg, args.split) and 0 if args.compare_only else run_demo(cfg, args.split))


def demo_overrides(config: str, sizes: str | None) -> list[str]:
    """``key=value`` overrides of this CPU class's sizes (``class_sizes``) from ``sizes``, by default
    configs/cpu-demo-classes.yaml when ``config`` is configs/cpu-demo.yaml."""
    from escrag.models import cpu_class

    if sizes is None and Path(config).resolve() != DEFAULT_CONFIG:
        return []
    return [f"{k}={v}" for k, v in class_sizes(cpu_class(), Path(sizes) if sizes else CLASS_SIZES).items()]


def run_demo(cfg: Config, split: str = "test") -> int:
    from escrag.models import cpu_class
    from ray_jobs.pipeline import run_pipeline

    start = time.time()
    print(compute_note(cfg), flush=True)
    banner("ESConv and the embedded models")
    show_data_and_models(cfg)
    banner("the pipeline: pairs -> index -> reward head -> cold-start SFT -> retrieval-augmented GRPO")
    report = run_pipeline(cfg, on_stage=pace_check(expected_run(cpu_class())))
    banner("retrieval-augmented GRPO")
    show_curve(cfg)
    t0 = banner("RAG inference on held-out test states")
    show_answers(cfg, split)
    print(f"({time.time() - t0:.1f} s)")
    times = ", ".join(f"{k} {v.get('seconds', 0):.0f} s" if v["ran"] else f"{k} reused" for k, v in report.items())
    grpo = run_paths(cfg).grpo
    print(f"\nstages: {times}")
    print(f"reward and KL curves: {grpo / 'reward_curve.png'} (per-step metrics {grpo / 'metrics.jsonl'}, "
          f"samples {grpo / 'samples.jsonl'}, TensorBoard {grpo / 'tensorboard'})")
    print(f"demo finished in {time.time() - start:.0f} s; outputs under {cfg.run.output_dir}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
