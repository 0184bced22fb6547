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

Departures from the paper, for a 2-core CPU (the time to expect: docs/measurements.md): SmolLM2-135M instead of Qwen2.5-3B/7B,
all-MiniLM-L6-v2 instead of bge-m3, ESConv turns instead of ESC-Preference as the exemplar corpus,
silver pairs (gold turn vs a corrupted one) instead of ESC-Preference for the reward head, bootstrapped
SFT demonstrations instead of GPT-4o ones, and a few GRPO steps instead of 2 epochs of 128 states.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path

from escrag.config import Config, load_config, run_paths
from escrag.errors import run_main


def banner(step: str) -> float:
    print(f"\n=== {step} ===", flush=True)
    return time.time()


WALL_TIMES = Path(__file__).resolve().parent.parent / "bench" / "results" / "wall_times.json"


def expected_minutes(dtypes: str) -> int | None:
    """Minutes a fresh-clone ``make demo`` took on 2 cores in ``dtypes`` (bfloat16 or float32 paths):
    the one source the README and docs/measurements.md also show (bench/results/wall_times.json)."""
    try:
        rows = json.loads(WALL_TIMES.read_text())["rows"]
    except (OSError, ValueError, KeyError):
        return None
    found = [r["seconds"] for r in rows if r.get("what") == "make demo" and r.get("dtypes") == dtypes]
    return round(found[-1] / 60) if found else None


def compute_note(cfg: Config) -> str:
    """The dtypes the demo computes in on this machine and how long a fresh-clone demo took on 2 cores
    in them (``expected_minutes``): a CPU without fast bfloat16 runs the float32 path."""
    from escrag.models import engine_dtype, fast_bfloat16

    fast = fast_bfloat16("cpu")
    learner, reward = cfg.policy.compute_dtype, cfg.reward.compute_dtype
    rollout = engine_dtype(cfg.rollout.dtype, learner, cfg.rollout.device)
    minutes = expected_minutes("bfloat16" if fast and "bfloat16" in (learner, rollout) else "float32")
    why = "" if fast else " (this CPU has no AMX / AVX512-BF16: bfloat16 matmuls would be emulated)"
    took = f"; a fresh-clone demo took ~{minutes} minutes on 2 cores in these dtypes" if minutes else ""
    return f"compute: learner {learner}, rollout engine {rollout}, reward backbone {reward}{why}{took}"


def show_data_and_models(cfg: Config) -> None:
    from escrag.data import SPLITS, split_stats
    from escrag.models import resolve_model

    for split in SPLITS:
        s = split_stats(split)
        print(f"{split}: {s['dialogues']} dialogues, {s['states']} dialogue states")
    for spec in sorted({cfg.policy.model, cfg.reward.backbone, cfg.retriever.embedder}):
        print(f"{spec} -> {resolve_model(spec)}")
    print(compute_note(cfg))


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
    args = p.parse_args(argv)
    cfg = load_config(args.config, args.override)
    return run_main("demo", lambda: show_answers(cfg, args.split) and 0 if args.compare_only else run_demo(cfg, args.split))


def run_demo(cfg: Config, split: str = "test") -> int:
    from ray_jobs.pipeline import run_pipeline

    start = time.time()
    banner("ESConv and the embedded models")
    show_data_and_models(cfg)
    banner("the pipeline: pairs -> index -> reward head -> cold-start SFT -> retrieval-augmented GRPO")
    report = run_pipeline(cfg)
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
