"""The embedded demo that ``make demo`` runs: every stage of ESCRAG-R1 on the embedded default.

    python -m ray_jobs.demo --config configs/cpu-demo.yaml [-o key=value ...]

Owns: the order of the stages and what is printed between them. Each stage calls the module that
owns the work; stages whose output already exists in ``run.output_dir`` are reused, so a second run
resumes instead of starting over (an interrupted GRPO stage resumes from its last checkpoint).

Stages: ESConv states -> models (converted once, cached) -> exemplar index over ESConv train ->
silver preference pairs -> reward head (frozen SmolLM2 features + linear head) -> cold-start SFT ->
retrieval-augmented GRPO with LoRA (``ray_jobs.train_grpo``) -> RAG inference on held-out test
states, printed with their rewards -> the reward curve and where its plot is.

Departures from the paper, for a 2-core CPU in ~20 minutes: SmolLM2-135M instead of Qwen2.5-3B/7B,
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

from escrag.config import Config, load_config, output_path
from escrag.errors import run_main


def banner(step: str) -> float:
    print(f"\n=== {step} ===", flush=True)
    return time.time()


def stage_data(cfg: Config) -> None:
    from escrag.data import SPLITS, split_stats

    for split in SPLITS:
        s = split_stats(split)
        print(f"{split}: {s['dialogues']} dialogues, {s['states']} dialogue states")


def stage_models(cfg: Config) -> None:
    from escrag.models import resolve_model

    for spec in sorted({cfg.policy.model, cfg.reward.backbone, cfg.retriever.embedder}):
        print(f"{spec} -> {resolve_model(spec)}")


def stage_index(cfg: Config) -> None:
    from retriever_server.build import build_index, index_dir
    from retriever_server.index import read_manifest

    out = index_dir(cfg)
    if not (out / "manifest.json").is_file():
        print(f"embedding the {cfg.retriever.source} exemplar corpus with {cfg.retriever.embedder} ...")
        build_index(cfg, out=out)
    m = read_manifest(out)
    print(f"index {out}: {m['count']} exemplars x {m['dim']} ({m['index_type']}, {m['embedder']})")


def pairs_path(cfg: Config) -> Path:
    return Path(cfg.reward.pairs) if cfg.reward.pairs else output_path(cfg, "prefs", "silver_pairs.jsonl")


def stage_pairs(cfg: Config) -> None:
    from escrag.pairs import bootstrap_pairs, load_pairs, write_pairs

    path = pairs_path(cfg)
    if not path.is_file():
        print("bootstrapping silver pairs from ESConv train (gold turn vs a corrupted turn) ...")
        write_pairs(bootstrap_pairs(cfg.data.train, cfg.run.seed, cfg.reward.max_pairs), path)
    print(f"{len(load_pairs(path))} preference pairs in {path}")


def rm_dir(cfg: Config) -> Path:
    return Path(cfg.reward.head_dir) if cfg.reward.head_dir else output_path(cfg, "rm")


def stage_reward(cfg: Config) -> None:
    from reward_server.train import train_reward_model

    out = rm_dir(cfg)
    if not (out / "metrics.json").is_file():
        print(f"training the linear reward head on frozen {cfg.reward.backbone} features ...")
        train_reward_model(cfg, pairs_path(cfg), out)
    m = json.loads((out / "metrics.json").read_text())
    print(f"reward head {out}: held-out pairwise accuracy {m['heldout_accuracy']:.3f} "
          f"on {m['n_heldout']} pairs (trained on {m['n_train']})")


def sft_dir(cfg: Config) -> Path:
    return output_path(cfg, "sft")


def stage_sft(cfg: Config) -> None:
    from trainer.sft import train_sft

    out = sft_dir(cfg)
    if not (out / "escrag_meta.json").is_file():
        train_sft(cfg, out=out)
    meta = json.loads((out / "escrag_meta.json").read_text())
    print(f"cold-start policy {out}: {meta['examples']} demonstrations, {meta['steps']} steps, "
          f"loss {meta['losses'][0]:.3f} -> {meta['losses'][-1]:.3f}")


def grpo_config(cfg: Config, retriever_url: str, reward_url: str) -> Config:
    """The GRPO job's config: starts from the SFT policy and uses the servers the demo started."""
    return dataclasses.replace(
        cfg, policy=dataclasses.replace(cfg.policy, model=str(sft_dir(cfg))),
        retriever=dataclasses.replace(cfg.retriever, url=retriever_url, index_dir=str(_index_dir(cfg))),
        reward=dataclasses.replace(cfg.reward, url=reward_url, head_dir=str(rm_dir(cfg))))


def _index_dir(cfg: Config) -> Path:
    from retriever_server.build import index_dir

    return index_dir(cfg)


def stage_grpo(cfg: Config, retriever_url: str, reward_url: str) -> None:
    from ray_jobs.train_grpo import total_steps, train, train_states
    from trainer.metrics import read_metrics

    gcfg = grpo_config(cfg, retriever_url, reward_url)
    meta_file = output_path(cfg, "policy", "escrag_meta.json")
    steps = total_steps(gcfg, len(train_states(gcfg)))
    done = meta_file.is_file() and json.loads(meta_file.read_text()).get("steps") == steps
    if not done:
        train(gcfg, resume=True)
    rows = read_metrics(output_path(cfg, "metrics.jsonl"))
    print("reward curve (step: reward mean ± std | format | KL | zero-advantage groups):")
    for r in rows:
        print(f"  {r['step']:3d}: {r.get('reward_mean', 0):+.3f} ± {r.get('reward_std', 0):.3f} | "
              f"{r.get('format_mean', 0):.2f} | {r.get('kl', 0):.5f} | {r.get('zero_adv_groups', 0)}")


async def _answer_all(cfg: Config, states, retriever_url: str, reward_url: str) -> list[tuple[dict, dict]]:
    from escrag.sampling import derive_seed
    from retriever_server.client import RetrieverClient
    from reward_server.client import RewardClient
    from rollout.engine import make_engine
    from rollout.episode import answer, engine_chat, state_id

    chat = engine_chat(make_engine(cfg, model_spec=str(output_path(cfg, "policy"))), cfg)  # shared batches
    retriever, reward = RetrieverClient(retriever_url, cfg.retriever), RewardClient(reward_url, cfg.reward)
    try:
        answers = await asyncio.gather(*(answer(s.history, chat, retriever, cfg,
                                                seed=derive_seed(cfg.run.seed, "demo", state_id(s)))
                                         for s in states))
        scores = await reward.score([{"history": s.history, "output": a["output"]} for s, a in zip(states, answers)])
    finally:
        await retriever.aclose()
        await reward.aclose()
    parts = [{k: scores[k][i] for k in ("rewards", "rm_scores", "format_rewards")} for i in range(len(states))]
    return list(zip(answers, parts))


def stage_inference(cfg: Config, retriever_url: str, reward_url: str) -> None:
    from escrag.data import load_states

    states = random.Random(cfg.run.seed).sample(load_states(cfg.data.test), cfg.run.demo_examples)
    results = asyncio.run(_answer_all(cfg, states, retriever_url, reward_url))
    for i, (s, (ans, score)) in enumerate(zip(states, results), 1):
        print(f"\n--- held-out test state {i}: {s.dialogue_id}/{s.turn_index} ({s.emotion}, {s.problem}) ---")
        print(f"client: {s.history[-1]['content']}")
        print(f"think: {ans['think'] or '(output did not parse)'}")
        print(f"exemplars: {[e.get('id') for e in ans['exemplars']]}")
        print(f"counselor: {ans['response']}")
        print(f"gold: {s.target}")
        print(f"reward {score['rewards']:+.3f} = rm {score['rm_scores']:+.3f} + format {score['format_rewards']:.0f}")


def run_stage(name: str, fn, timings: dict, *args) -> None:
    t0 = banner(name)
    fn(*args)
    timings[name] = time.time() - t0
    print(f"({timings[name]:.1f} s)", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ray_jobs.demo", description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/cpu-demo.yaml")
    p.add_argument("-o", "--override", action="append", default=[])
    args = p.parse_args(argv)
    return run_main("demo", lambda: run_demo(load_config(args.config, args.override)))


def run_demo(cfg: Config) -> int:
    from ray_jobs.services import job_services
    from ray_jobs.train_grpo import write_resolved_config

    start, timings = time.time(), {}
    for name, fn in [("ESConv dialogue states", stage_data), ("models (converted once, then cached)", stage_models),
                     ("exemplar index (ESConv train)", stage_index), ("silver preference pairs", stage_pairs),
                     ("reward head", stage_reward), ("cold-start SFT", stage_sft)]:
        run_stage(name, fn, timings, cfg)
    t0 = banner("starting the retriever and reward servers")
    served = dataclasses.replace(cfg, retriever=dataclasses.replace(cfg.retriever, index_dir=str(_index_dir(cfg))),
                                 reward=dataclasses.replace(cfg.reward, head_dir=str(rm_dir(cfg))))
    with job_services(served, write_resolved_config(served), output_path(cfg, "logs"), need_retriever=True) as urls:
        timings["servers"] = time.time() - t0
        run_stage("retrieval-augmented GRPO (LoRA)", stage_grpo, timings, cfg, *urls)
        run_stage("RAG inference on held-out test states", stage_inference, timings, cfg, *urls)
    print("\nstage timings: " + ", ".join(f"{k} {v:.0f} s" for k, v in timings.items()))
    print(f"reward and KL curves: {output_path(cfg, 'reward_curve.png')} "
          f"(per-step metrics {output_path(cfg, 'metrics.jsonl')}, TensorBoard {output_path(cfg, 'tensorboard')})")
    print(f"demo finished in {time.time() - start:.0f} s; outputs under {cfg.run.output_dir}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
