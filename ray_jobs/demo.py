"""The embedded demo that ``make demo`` runs: the pipeline job on the embedded default, then answers.

    python -m ray_jobs.demo --config configs/cpu-demo.yaml [-o key=value ...]
    python -m ray_jobs.demo --config FILE --compare-only   # only the held-out SFT vs GRPO comparison

Owns: what is printed around the pipeline (``ray_jobs.pipeline``: silver pairs -> exemplar index ->
reward head -> cold-start SFT -> retrieval-augmented GRPO with LoRA, each stage skipped when it is
up to date, an interrupted GRPO stage resumed from its last checkpoint), then RAG inference with the
trained policy on held-out test states, printed with their rewards, the reward curve, and the SFT
and GRPO policies scored on one fixed set of held-out test states with the same seeds (means and
their paired difference with 95% bootstrap intervals).

Departures from the paper, for a 2-core CPU in ~20 minutes: SmolLM2-135M instead of Qwen2.5-3B/7B,
all-MiniLM-L6-v2 instead of bge-m3, ESConv turns instead of ESC-Preference as the exemplar corpus,
silver pairs (gold turn vs a corrupted one) instead of ESC-Preference for the reward head, bootstrapped
SFT demonstrations instead of GPT-4o ones, and a few GRPO steps instead of 2 epochs of 128 states.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time

from escrag.config import Config, load_config, run_paths
from escrag.errors import run_main


def banner(step: str) -> float:
    print(f"\n=== {step} ===", flush=True)
    return time.time()


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


async def _answer_all(cfg: Config, policy: str, states, retriever_url: str, reward_url: str, tag: str = "demo",
                      samples: int = 1) -> list[tuple[dict, dict]]:
    """RAG answers of ``policy`` to ``states`` (``samples`` each, seeds from the state and sample
    index, so two policies get the same seeds) with their reward parts, state-major."""
    from escrag.seeds import derive_seed
    from retriever_server.client import RetrieverClient
    from reward_server.client import RewardClient
    from rollout.engines import make_engine
    from rollout.episode import answer, engine_chat

    chat = engine_chat(make_engine(cfg, model_spec=policy), cfg)  # one engine: the answers share batches
    retriever, reward = RetrieverClient(retriever_url, cfg.retriever), RewardClient(reward_url, cfg.reward)
    jobs = [(s, derive_seed(cfg.run.seed, tag, s.state_id, j)) for s in states for j in range(samples)]
    try:
        answers = await asyncio.gather(*(answer(s.history, chat, retriever, cfg, seed=seed) for s, seed in jobs))
        scores = await reward.score([{"history": s.history, "output": a["output"]} for (s, _), a in zip(jobs, answers)])
    finally:
        await retriever.aclose()
        await reward.aclose()
    parts = [{k: scores[k][i] for k in ("rewards", "rm_scores", "format_rewards")} for i in range(len(jobs))]
    return list(zip(answers, parts))


def compare_policies(cfg: Config, states, urls: dict) -> dict:
    """Held-out gain of GRPO over its SFT start: both policies answer the same fixed test states with
    the same seeds; per state the mean reward (training RM + format) of its answers. Returns each
    policy's mean and the paired difference, each with a bootstrap interval over states."""
    from evaluation.tables import bootstrap_ci

    n, ci = cfg.run.demo_compare_samples, (1000, 0.95, cfg.run.seed)
    per_state = {}
    for name, path in (("sft", run_paths(cfg).sft), ("grpo", run_paths(cfg).grpo / "policy")):
        res = asyncio.run(_answer_all(cfg, str(path), states, urls["retriever"], urls["reward"], "compare", n))
        rewards = [p["rewards"] for _, p in res]
        per_state[name] = [sum(rewards[i * n:(i + 1) * n]) / n for i in range(len(states))]
    delta = [g - s for g, s in zip(per_state["grpo"], per_state["sft"])]
    return {"states": [s.state_id for s in states], "samples": n, "per_state": per_state,
            **{k: bootstrap_ci(v, *ci) for k, v in per_state.items()}, "delta": bootstrap_ci(delta, *ci)}


def show_answers(cfg: Config) -> dict | None:
    """Answers to a few held-out test states, then (``run.demo_compare_states``) SFT vs GRPO scored on
    a fixed set of them; the comparison goes to ``<grpo>/heldout_compare.json``."""
    from escrag.atomic import write_json
    from escrag.data import load_states
    from ray_jobs.pipeline import grpo_config
    from ray_jobs.services import JobServices
    from ray_jobs.train_grpo import write_resolved_config

    gcfg = grpo_config(cfg)
    test = load_states(cfg.data.test)
    states = random.Random(cfg.run.seed).sample(test, cfg.run.demo_examples)
    fixed = random.Random(f"{cfg.run.seed}/compare").sample(test, cfg.run.demo_compare_states)
    with JobServices(gcfg, write_resolved_config(gcfg), run_paths(cfg).grpo / "logs", need_retriever=True) as svc:
        results = asyncio.run(_answer_all(cfg, str(run_paths(cfg).grpo / "policy"), states, svc.urls["retriever"],
                                          svc.urls["reward"]))
        _print_answers(states, results)
        if not fixed:
            return None
        t0 = banner(f"held-out: SFT vs GRPO on {len(fixed)} fixed test states x {cfg.run.demo_compare_samples} "
                    "answers (same seeds)")
        cmp = compare_policies(cfg, fixed, svc.urls)
    write_json(run_paths(cfg).grpo / "heldout_compare.json", cmp)
    fmt = "{:+.3f} [{:+.3f}, {:+.3f}]".format
    print(f"mean reward, 95% bootstrap interval over states:\n  SFT   {fmt(*cmp['sft'])}\n  GRPO  {fmt(*cmp['grpo'])}"
          f"\n  GRPO - SFT (paired) {fmt(*cmp['delta'])}  ({time.time() - t0:.0f} s)")
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
    p.add_argument("--compare-only", action="store_true",
                   help="skip the pipeline: answer and compare SFT vs GRPO of a finished run of this config")
    args = p.parse_args(argv)
    cfg = load_config(args.config, args.override)
    return run_main("demo", lambda: show_answers(cfg) and 0 if args.compare_only else run_demo(cfg))


def run_demo(cfg: Config) -> int:
    from ray_jobs.pipeline import run_pipeline

    start = time.time()
    banner("ESConv and the embedded models")
    show_data_and_models(cfg)
    banner("the pipeline: pairs -> index -> reward head -> cold-start SFT -> retrieval-augmented GRPO")
    report = run_pipeline(cfg)
    banner("retrieval-augmented GRPO")
    show_curve(cfg)
    t0 = banner("RAG inference on held-out test states")
    show_answers(cfg)
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
