"""Two policies answer the same held-out states with the same seeds through the RAG path, and the
comparison of their answers (``make demo``'s last stage, ``ray_jobs.demo --compare-only``).

Owns: ``answer_all`` (RAG answers with their reward parts, one engine for every policy on a CPU, each
answer independent of its batch), ``compare_policies`` (every answer kept in
``<grpo>/compare-<split>.jsonl``, the summary of ``evaluation.compare.summarize`` and the same answers
judged by the independent MiniLM proxy, ``evaluation.labels``) and ``print_compare``. The statistics themselves are ``evaluation.compare``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path

from escrag.config import Config, run_paths


async def answer_all(cfg: Config, asks: list[tuple[str, list]], retriever_url: str,
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
               and engine_dtype(cfg.rollout.dtype, cfg.policy.compute_dtype, cfg.rollout.device) in cpu_attention.DTYPES.values())
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
    from evaluation.labels import fit_proxy, judge_answers

    records = []
    # one classifier for both policies: its cache reads each shared conversation prefix once (~2x faster)
    risk = RiskClassifier.from_config(cfg) if cfg.safety.rollout_metric else None
    for name, res in both.items():
        answers, parts = [a for a, _ in res], [p for _, p in res]
        records += answer_records(name, jobs, answers, parts, _risks(risk, [s for s, _, _ in jobs], answers))
    path = run_paths(cfg).grpo / f"compare-{split}.jsonl"
    with atomic_file(path) as fh:
        fh.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    return {"split": split, "states": [s.state_id for s in states], "samples": cfg.run.demo_compare_samples,
            **summarize(records, cfg.eval.bootstrap, cfg.eval.ci, cfg.run.seed),
            "minilm_proxy": judge_answers(fit_proxy(cfg), str(path), cfg)}


def print_compare(cmp: dict) -> None:
    fmt = "{:+.3f} [{:+.3f}, {:+.3f}]".format
    rows = [("format rate", "format"), ("RM, all answers", "rm"), ("RM, answers parsing in both", "rm_both_parse"),
            ("reward (RM + format)", "reward"), ("strategy accuracy", "strategy_hit")]
    print("95% bootstrap intervals over states; GRPO - SFT paired:")
    for label, key in [*rows, ("independent MiniLM proxy", "minilm_proxy")]:
        c = cmp[key]
        print(f"  {label:<30} SFT {fmt(*c['sft'])}  GRPO {fmt(*c['grpo'])}  GRPO - SFT (paired) {fmt(*c['delta'])}")
    print(f"What this shows: whether GRPO moved {c['states']} held-out answers by the reward it was trained on (RM) and "
          "by one it was not (the MiniLM proxy, fitted on other features); not that it supports people better: no "
          "person or judge rated these answers (experiments/strategy_claim/ tests the method against ESConv's labels).")
    sa = cmp["strategy_accuracy"]
    print("strategy accuracy, Wilson 95% over answers: " + ", ".join(
        f"{k} {fmt(*v)}" for k, v in sa.items() if isinstance(v, (list, tuple))) + f" (majority: {sa['majority_label']})")
