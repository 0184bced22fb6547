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
import dataclasses
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
    rollout = engine_dtype(cfg.rollout.dtype, cfg.policy.dtype, cfg.rollout.device)
    minutes = expected_minutes("bfloat16" if fast and "bfloat16" in (cfg.policy.dtype, rollout) else "float32")
    why = "" if fast else " (this CPU has no AMX / AVX512-BF16: bfloat16 matmuls would be emulated)"
    took = f"; a fresh-clone demo took ~{minutes} minutes on 2 cores in these dtypes" if minutes else ""
    return f"compute: learner {cfg.policy.dtype}, rollout engine {rollout}, reward backbone {cfg.reward.dtype}{why}{took}"


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


async def _answer_all(cfg: Config, asks: list[tuple[str, list]], retriever_url: str,
                      reward_url: str) -> list[list[tuple[dict, dict]]]:
    """RAG answers with their reward parts for each ``(policy, jobs)`` of ``asks`` (jobs: (state, seed)
    pairs), in order: one list per ask.

    An answer depends only on its state and seed (and the config), never on which other states were
    asked with it or when (tests/test_pipeline.py). With a transformers engine on the CPU in float32 or
    bfloat16 (the native attention kernels: a row reads only its own K/V) an ask's answers decode in
    batches of ``rollout.max_batch`` rows under ``rollout.batch_invariant``, each bitwise as it would
    alone (tests/test_engine_continuous.py, both dtypes); the asks take turns on one engine, which loads
    the next policy's weights (one compile in all). Otherwise (a GPU's SDPA, float16) each answer decodes
    alone, an engine of one row, and the asks run side by side on a share of the threads each. The
    answers are scored after all of them
    (a score does not depend on its batch on a CPU: reward_server/model.py)."""
    import torch
    from safetensors.torch import load_file

    from escrag.models import engine_dtype, resolve_device
    from retriever_server.client import RetrieverClient
    from reward_server.client import RewardClient
    from rollout.engines import cpu_attention, make_engine
    from rollout.episode import answer, engine_chat

    batched = (cfg.rollout.engine == "transformers" and resolve_device(cfg.rollout.device) == "cpu"
               and engine_dtype(cfg.rollout.dtype, cfg.policy.dtype, cfg.rollout.device) in cpu_attention.DTYPES.values())
    rows = cfg.rollout.max_batch if batched else 1  # a fixed row count: the kernels' shapes never change
    run = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, max_batch=rows, batch_invariant=batched))
    turns = [[ask] for ask in asks] if batched else [asks]
    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, threads // len(turns[0])))  # read by the engine threads started here
    retriever, reward = RetrieverClient(retriever_url, cfg.retriever), RewardClient(reward_url, cfg.reward)
    out, engines, loaded = [], [], None
    try:
        for version, turn in enumerate(turns):
            if not engines:
                engines = [make_engine(run, model_spec=policy) for policy, _ in turn]
            elif turn[0][0] != loaded:  # the next policy's weights into the same engine: no second compile
                files = sorted(Path(turn[0][0]).glob("*.safetensors"))  # save_pretrained: one file or shards
                engines[0].load_weights({k: v for f in files for k, v in load_file(str(f)).items()}, version)
            loaded = turn[0][0]
            answers = await asyncio.gather(*(asyncio.gather(*(answer(s.history, engine_chat(e, run), retriever, cfg,
                                                                     seed=seed) for s, seed in jobs))
                                             for e, (_, jobs) in zip(engines, turn)))
            for got, (_, jobs) in zip(answers, turn):
                score = await reward.score([{"history": s.history, "output": a["output"]}
                                            for (s, _), a in zip(jobs, got)])
                parts = [{k: score[k][i] for k in ("rewards", "rm_scores", "format_rewards")} for i in range(len(got))]
                out.append(list(zip(got, parts)))
    finally:
        torch.set_num_threads(threads)
        await retriever.aclose()
        await reward.aclose()
    return out


def _risks(risk, states, answers: list[dict]) -> list[str | None]:
    """The crisis check's level of each conversation + answer (None without a ``risk`` classifier)."""
    if risk is None:
        return [None] * len(answers)
    from escrag.safety.types import with_answer

    return [a.level for a in risk.assess_many([with_answer(s.history, x["response"]) for s, x in zip(states, answers)])]


def compare_policies(cfg: Config, states, jobs: list[tuple], both: dict, split: str = "test") -> dict:
    """SFT vs GRPO on ``states`` of ``split`` from ``both`` ({"sft": ..., "grpo": ...}: each policy's
    answers to ``jobs`` with their reward parts); every answer goes to ``<grpo>/compare-<split>.jsonl``
    and the summary (``evaluation.compare.summarize``) is returned."""
    from escrag.atomic import atomic_file
    from escrag.safety.classifier import RiskClassifier
    from evaluation.compare import answer_records, summarize

    records = []
    # one classifier for both policies: its cache reads each shared conversation prefix once (~2x faster)
    risk = RiskClassifier.from_config(cfg) if cfg.safety.rollout_metric else None
    for name, res in both.items():
        answers, parts = [a for a, _ in res], [p for _, p in res]
        records += answer_records(name, jobs, answers, parts, _risks(risk, [s for s, _, _ in jobs], answers))
    with atomic_file(run_paths(cfg).grpo / f"compare-{split}.jsonl") as fh:
        fh.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    return {"split": split, "states": [s.state_id for s in states], "samples": cfg.run.demo_compare_samples,
            **summarize(records, cfg.eval.bootstrap, cfg.eval.ci, cfg.run.seed)}


def show_answers(cfg: Config, split: str = "test") -> dict | None:
    """Answers to a few held-out test states, then (``run.demo_compare_states``) SFT vs GRPO on a
    fixed set of ``split`` states (valid: to choose a recipe; test: once per reported number); the
    summary goes to ``<grpo>/compare-<split>.json``, every answer beside it (``.jsonl``)."""
    from escrag.atomic import write_json
    from escrag.data import load_states
    from escrag.seeds import derive_seed
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
        *first, last = asyncio.run(_answer_all(cfg, asks, svc.urls["retriever"], svc.urls["reward"]))
        _print_answers(states, last[len(compare):])
        if not fixed:
            return None
        banner(f"{split}: SFT vs GRPO on {len(fixed)} fixed {split} states x {cfg.run.demo_compare_samples} "
               "answers (same seeds)")
        cmp = compare_policies(cfg, fixed, jobs, {"sft": first[0], "grpo": last[:len(compare)]}, split)
    write_json(run_paths(cfg).grpo / f"compare-{split}.json", cmp)
    _print_compare(cmp)
    print(f"({time.time() - t0:.0f} s for the demo answers and the comparison; answers in "
          f"{run_paths(cfg).grpo / f'compare-{split}.jsonl'})")
    return cmp


def _print_compare(cmp: dict) -> None:
    fmt = "{:+.3f} [{:+.3f}, {:+.3f}]".format
    rows = [("format rate", "format"), ("RM, all answers", "rm"), ("RM, answers parsing in both", "rm_both_parse"),
            ("reward (RM + format)", "reward"), ("strategy accuracy", "strategy_hit")]
    print("95% bootstrap intervals over states; GRPO - SFT paired:")
    for label, key in rows:
        c = cmp[key]
        print(f"  {label:<30} SFT {fmt(*c['sft'])}  GRPO {fmt(*c['grpo'])}  GRPO - SFT (paired) {fmt(*c['delta'])}")
    sa = cmp["strategy_accuracy"]
    print("strategy accuracy, Wilson 95% over answers: " + ", ".join(
        f"{k} {fmt(*v)}" for k, v in sa.items() if isinstance(v, (list, tuple))) + f" (majority: {sa['majority_label']})")


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
