"""The two-stage retrieval-augmented episode (paper eq. 7-8, Algorithm 1 lines 5-10) for one group.

Owns: ``run_group`` (one dialogue state -> one ``ScoredGroup``), ``run_groups`` (many states
concurrently on one engine), the prompt ids of both stages and the loss masks of the record.

For a state H and group size N: N stage-1 samples ĉ_j ~ π(·|H) -> the response text of each (an
unparseable output is used raw; an empty one falls back to the client's last turn) -> one batched
retriever call -> N stage-2 prompts (H, ĉ_j, E_j) -> N stage-2 samples c_j -> one batched reward call
on (H, c_j) -> the record. Engine calls go through an ``EngineScheduler``: while one group waits on
HTTP, the engine generates for another, and groups' requests that queue up together share a batch.

Records (``escrag/records.py``): the stage-2 ``TokenSequence`` is stage-2 prompt ids + completion
ids, loss mask 1 on the completion only, ``old_logprobs`` the engine's raw log-probs there and 0.0 on
the prompt. With ``rollout.train_stage1`` the stage-1 sequence (stage 1 prompt + ĉ_j, same masking)
comes first: our option, not the paper's. With ``rollout.rag: false`` (vanilla GRPO ablation) a
sample is one stage-1 sequence (``stage=1``, it is prompt(H) + c), no retrieval, ``initial_output``
empty. The reward sees the full history H; the policy prompts keep ``data.max_history_turns``.
"""

from __future__ import annotations

import asyncio
import time

from escrag.config import Config
from escrag.data import DialogueState
from escrag.formats import response_text
from escrag.prompts import render, stage1_messages, stage2_messages
from escrag.records import Sample, ScoredGroup, TokenSequence
from rollout.engine import EngineScheduler, Generation, GenerationEngine, SamplingParams


def state_id(state: DialogueState) -> str:
    return f"{state.dialogue_id}/{state.turn_index}"


def sampling_params(cfg: Config, stage: int) -> SamplingParams:
    ro = cfg.rollout
    max_new = ro.max_new_tokens_stage1 if stage == 1 else ro.max_new_tokens_stage2
    return SamplingParams(max_new, ro.temperature, ro.top_p, ro.top_k)


def prompt_ids(tokenizer, messages: list[dict]) -> list[int]:
    """Chat-template ids of a prompt (the template already holds the special tokens)."""
    return tokenizer(render(tokenizer, messages), add_special_tokens=False).input_ids


def retrieval_query(output: str, history: list[dict]) -> str:
    """The response text of a stage-1 output, raw when it does not parse, the client's last turn
    when the output is empty (the retriever rejects empty queries)."""
    query = response_text(output).strip()
    return query or history[-1]["content"]


def as_scheduler(engine: GenerationEngine | EngineScheduler, max_batch: int = 64) -> EngineScheduler:
    return engine if isinstance(engine, EngineScheduler) else EngineScheduler(engine, max_batch)


def sequence(prompt: list[int], gen: Generation, stage: int, trained: bool = True) -> TokenSequence:
    """Prompt + completion with the mask set at the source: completion tokens only."""
    mask = 1 if trained else 0
    return TokenSequence(input_ids=list(prompt) + list(gen.token_ids),
                         loss_mask=[0] * len(prompt) + [mask] * len(gen.token_ids),
                         old_logprobs=[0.0] * len(prompt) + [float(x) for x in gen.logprobs],
                         stage=stage)


async def run_group(state: DialogueState, engine, retriever, reward, cfg: Config,
                    version: int) -> ScoredGroup:
    """One scored group of ``cfg.rollout.group_size`` samples for ``state``; ``version`` is the
    policy version recorded (the caller keeps weights fixed while the group runs)."""
    sched = as_scheduler(engine, cfg.rollout.max_batch)
    tok, ro, n = sched.tokenizer, cfg.rollout, cfg.rollout.group_size
    turns, stats, t0 = cfg.data.max_history_turns, {}, time.perf_counter()
    p1 = prompt_ids(tok, stage1_messages(state.history, turns))
    gens1 = await sched.generate([p1] * n, sampling_params(cfg, 1))
    stats["stage1_s"] = time.perf_counter() - t0
    if not ro.rag:
        samples = [Sample([sequence(p1, g, stage=1)], output=g.text) for g in gens1]
        finals = gens1
    else:
        samples, finals = await _stage2(state, sched, retriever, cfg, p1, gens1, stats)
    t = time.perf_counter()
    scores = await reward.score([{"history": state.history, "output": g.text} for g in finals])
    stats["reward_s"] = time.perf_counter() - t
    for s, r, rm, fmt in zip(samples, scores["rewards"], scores["rm_scores"], scores["format_rewards"]):
        s.reward, s.rm_score, s.format_reward = float(r), float(rm), float(fmt)
    stats.update(total_s=time.perf_counter() - t0, prompt1_tokens=len(p1),
                 stage1_tokens=sum(len(g.token_ids) for g in gens1),
                 stage2_tokens=sum(len(g.token_ids) for g in finals) if ro.rag else 0)
    return ScoredGroup(state_id(state), samples, version, stats)


async def _stage2(state, sched: EngineScheduler, retriever, cfg: Config, p1: list[int],
                  gens1: list[Generation], stats: dict):
    """Retrieve for every stage-1 sample, then sample the retrieval-augmented responses."""
    turns = cfg.data.max_history_turns
    t = time.perf_counter()
    queries = [retrieval_query(g.text, state.history) for g in gens1]
    exemplars = await retriever.retrieve(queries, k=cfg.retriever.k)
    stats["retrieve_s"] = time.perf_counter() - t
    p2s = [prompt_ids(sched.tokenizer, stage2_messages(state.history, response_text(g.text), ex, turns))
           for g, ex in zip(gens1, exemplars)]
    t = time.perf_counter()
    gens2 = await sched.generate(p2s, sampling_params(cfg, 2))
    stats["stage2_s"] = time.perf_counter() - t
    stats["prompt2_tokens"] = sum(len(p) for p in p2s)
    samples = []
    for g1, g2, p2, ex in zip(gens1, gens2, p2s, exemplars):
        seqs = [sequence(p2, g2, stage=2)]
        if cfg.rollout.train_stage1:
            seqs.insert(0, sequence(p1, g1, stage=1))
        samples.append(Sample(seqs, output=g2.text, initial_output=g1.text,
                              exemplar_ids=[str(e["id"]) for e in ex]))
    return samples, gens2


async def run_groups(states: list[DialogueState], engine, retriever, reward, cfg: Config,
                     version: int) -> list[ScoredGroup]:
    """All states' groups concurrently on one engine (pipelined, see module doc), in input order."""
    sched = as_scheduler(engine, cfg.rollout.max_batch)
    return list(await asyncio.gather(*(run_group(s, sched, retriever, reward, cfg, version)
                                       for s in states)))
