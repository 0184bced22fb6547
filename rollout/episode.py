"""The two-stage retrieval-augmented path (paper eq. 7-8, Algorithm 1): the one copy every caller uses.

Owns: the stage functions and the two things built from them. The training episode (``run_group``:
one dialogue state -> one ``ScoredGroup`` with masks set here), RAG inference over any chat function
(``answer``: the counselor API, for a local engine or a remote endpoint, and the evaluation), and the
pieces the OpenRLHF agent calls step by step (``trainer/openrlhf/agent.py``).

Layout. Stage 1: the stage-1 messages (system + history) -> ĉ. Stage 2 continues the same
conversation: + ``assistant: ĉ`` + a system turn holding the k exemplars retrieved with ĉ's response
text and the instruction (``escrag.prompts.feedback_message``) -> c. At the token level the stage-2
input is ``p1 + ĉ ids + feedback ids`` (``feedback_text``): what OpenRLHF's multi-turn executor builds
as action 1, environment feedback, action 2. The record (``escrag.records``) is that one sequence
plus c, with loss mask 1 on c, on ĉ too with ``rollout.train_stage1`` (our option, not the paper's),
and 0 on the prompt and the feedback; ``rollout.rag: false`` (vanilla GRPO) is ``p1 + c``.

Retrieval during training excludes chunks of the state's own dialogue (``retrieve``): with ESConv as
corpus its gold turn is a chunk, and with preference pairs its preferred reply is; copying it would
be the best answer. Inference excludes nothing unless asked.

Seeds. Sample j of a group draws stage s with ``derive_seed(group_seed, j, s)``, so a group's samples
depend only on the weights and the group seed (the driver derives it from the run seed, the step and
the state), never on batching or timing: a resumed run draws what the uninterrupted one drew.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from escrag import prompts
from escrag.config import Config
from escrag.data import DialogueState
from escrag.formats import parse_output, reply_text, response_text
from escrag.records import Sample, ScoredGroup, TokenSequence
from escrag.safety.types import level_counts, with_answer
from escrag.seeds import derive_seed
from rollout.engines.base import (
    ContextLengthError,
    EngineScheduler,
    Generation,
    GenerationEngine,
    SamplingParams,
)

Chat = Callable[[list[dict], int, "int | None"], Awaitable[str]]  # (messages, stage, seed) -> output
_ACTION = "\u2063ESCRAG-ACTION\u2063"  # stands for ĉ while the chat template renders the feedback turn


# ------------------------------------------------------------------ message level


def stage1_messages(history: list[dict], cfg: Config) -> list[dict]:
    """The stage-1 prompt for H (eq. 7)."""
    return prompts.stage1_messages(history, cfg.data.max_history_turns)


def stage2_messages(history: list[dict], stage1_output: str, exemplars: list[dict], cfg: Config) -> list[dict]:
    """The stage-2 prompt for (H, ĉ, E) (eq. 8)."""
    return prompts.stage2_messages(history, stage1_output, exemplars, cfg.data.max_history_turns)


feedback_message = prompts.feedback_message


def retrieval_query(stage1_output: str, history: list[dict]) -> str:
    """R's query: the response text of ĉ, raw when it does not parse, the client's last turn when it
    is empty (the retriever rejects empty queries)."""
    query = response_text(stage1_output).strip()
    return query or history[-1]["content"]


async def retrieve(retriever, queries: list[str], k: int,
                   exclude_dialogue_ids: list[str | None] | None = None) -> list[list[dict]]:
    """k exemplars per query, best first, never from the dialogue named for that query."""
    return await retriever.retrieve(queries, k=k, exclude_dialogue_ids=exclude_dialogue_ids)


async def answer(history: list[dict], chat: Chat, retriever, cfg: Config, *, rag: bool = True,
                 k: int | None = None, seed: int | None = None, exclude_dialogue_id: str | None = None) -> dict:
    """RAG inference (Algorithm 1, lines 18-23) for one history over any ``chat`` function; with
    ``rag=False`` one stage. Returns the final output, its client-facing text and the stage-1 parts.
    Where the k exemplars make the stage-2 prompt longer than the engine's context (long retrieved
    chunks: our departure, the paper does not say), the last-ranked are dropped until it fits, and
    ``exemplars`` holds those shown; a history too long for stage 1 is still the caller's error."""
    seeds = (None, None) if seed is None else (derive_seed(seed, 1), derive_seed(seed, 2))
    first = await chat(stage1_messages(history, cfg), 1, seeds[0])
    if not rag:
        return _answer_dict(first, "", [], "")
    query = retrieval_query(first, history)
    (exemplars,) = await retrieve(retriever, [query], k or cfg.retriever.k, [exclude_dialogue_id])
    while True:  # the exemplars that fit the context, best first: the client's input did fit stage 1
        try:
            final = await chat(stage2_messages(history, first, exemplars, cfg), 2, seeds[1])
            return _answer_dict(final, first, exemplars, query)
        except ContextLengthError:
            if not exemplars:
                raise
            exemplars = exemplars[:-1]


def _answer_dict(output: str, initial_output: str, exemplars: list[dict], query: str) -> dict:
    parsed = parse_output(output)
    initial = response_text(initial_output) if initial_output else ""
    return {"output": output, "response": reply_text(output, fallback=initial),
            "think": parsed.think if parsed.ok else "", "format_ok": parsed.ok,
            "initial_output": initial_output, "initial": initial, "exemplars": exemplars, "query": query}


def engine_chat(engine, cfg: Config, params: dict[int, SamplingParams] | None = None,
                usage: dict | None = None) -> Chat:
    """A ``Chat`` over a local engine (or scheduler); ``usage`` (if given) accumulates token counts."""
    sched = as_scheduler(engine, cfg.rollout.max_batch)
    params = params or {s: SamplingParams.from_config(cfg.rollout, s) for s in (1, 2)}

    async def chat(messages: list[dict], stage: int, seed: int | None) -> str:
        ids = prompt_ids(sched.tokenizer, messages)
        if len(ids) >= cfg.rollout.max_seq_len:  # what the engine refuses, in vLLM's words (HTTP 400)
            raise ContextLengthError(f"This model's maximum context length is {cfg.rollout.max_seq_len} tokens. "
                                     f"However, your messages resulted in {len(ids)} tokens (stage {stage} prompt). "
                                     "Please reduce the length of the messages (rollout.max_seq_len).")
        (gen,) = await sched.generate([ids], params[stage], None if seed is None else [seed])
        if usage is not None:
            usage["prompt_tokens"] = usage.get("prompt_tokens", 0) + len(ids)
            usage["completion_tokens"] = usage.get("completion_tokens", 0) + len(gen.token_ids)
            usage["finish_reason"] = gen.finish_reason
        return gen.text

    return chat


# ------------------------------------------------------------------ token level


def prompt_ids(tokenizer, messages: list[dict]) -> list[int]:
    """Chat-template ids of a prompt (the template already holds the special tokens)."""
    return tokenizer(prompts.render(tokenizer, messages), add_special_tokens=False).input_ids


def feedback_text(tokenizer, stage1_msgs: list[dict], exemplars: list[dict], ended_with_eos: bool) -> str:
    """What follows ĉ's tokens to open stage 2: the end of the assistant turn (unless ĉ ended with the
    EOS token), the feedback turn, and the generation prompt, as the chat template renders them."""
    msgs = [*stage1_msgs, {"role": "assistant", "content": _ACTION}, feedback_message(exemplars)]
    text = prompts.render(tokenizer, msgs)
    tail = text[text.index(_ACTION) + len(_ACTION):]
    eos = tokenizer.eos_token or ""
    if ended_with_eos and eos and tail.startswith(eos):
        tail = tail[len(eos):]
    return tail


def feedback_ids(tokenizer, stage1_msgs: list[dict], exemplars: list[dict], ended_with_eos: bool) -> list[int]:
    return tokenizer(feedback_text(tokenizer, stage1_msgs, exemplars, ended_with_eos),
                     add_special_tokens=False).input_ids


def record(p1: list[int], g1: Generation, feedback: list[int] | None, g2: Generation | None,
           train_stage1: bool) -> TokenSequence:
    """The learner's sequence with masks set here: ``p1 + ĉ + feedback + c`` (or ``p1 + c`` when
    ``feedback`` is None and ``g2`` is None, i.e. ĉ is the final answer of vanilla GRPO)."""
    ids, mask, logp, ranges = list(p1), [0] * len(p1), [0.0] * len(p1), []
    parts = [(g1, train_stage1 or g2 is None)] if g2 is None else [(g1, train_stage1), (g2, True)]
    for i, (gen, trained) in enumerate(parts):
        if i == 1:
            ids += feedback
            mask += [0] * len(feedback)
            logp += [0.0] * len(feedback)
        ranges.append((len(ids), len(ids) + len(gen.token_ids)))
        ids += gen.token_ids
        mask += [int(trained)] * len(gen.token_ids)
        logp += [float(x) for x in gen.logprobs]
    return TokenSequence(ids, mask, logp, ranges)


def as_scheduler(engine: GenerationEngine | EngineScheduler, max_batch: int):
    """An object with ``async generate(prompt_ids, params, seeds)`` and ``tokenizer``: the engine's own
    continuous-batching front (``engine.scheduler()``), the object itself when it is already async,
    else an ``EngineScheduler`` over the engine merging up to ``max_batch`` (``rollout.max_batch``) rows."""
    if isinstance(engine, EngineScheduler) or getattr(engine, "is_async", False):
        return engine
    if hasattr(engine, "scheduler"):
        return engine.scheduler()
    return EngineScheduler(engine, max_batch)


async def run_group(state: DialogueState, engine, retriever, reward, cfg: Config, version: int,
                    seed: int = 0, risk=None) -> ScoredGroup:
    """One scored group of ``rollout.group_size`` samples for ``state`` (Algorithm 1, lines 6-11);
    ``version`` is the policy version recorded (the caller keeps weights fixed while it runs). With a
    ``risk`` classifier (``escrag.safety``) the stats count the rollouts whose conversation + final
    answer is high / elevated (``risk_high``, ``risk_elevated``) among the ``risk_checked`` first ones
    (``safety.rollout_metric_samples``; all by default): a reported metric, not a reward."""
    sched = as_scheduler(engine, cfg.rollout.max_batch)
    ro, n, stats, t0 = cfg.rollout, cfg.rollout.group_size, {}, time.perf_counter()
    msgs1 = stage1_messages(state.history, cfg)
    p1 = prompt_ids(sched.tokenizer, msgs1)
    gens1 = await sched.generate([p1] * n, SamplingParams.from_config(ro, 1),
                                 [derive_seed(seed, j, 1) for j in range(n)])
    stats["stage1_s"] = time.perf_counter() - t0
    if ro.rag:
        samples, finals = await _stage2(state, sched, retriever, cfg, msgs1, p1, gens1, seed, stats)
    else:
        samples = [Sample(record(p1, g, None, None, True), output=g.text) for g in gens1]
        finals = gens1
    t = time.perf_counter()
    scores = await reward.score([{"history": state.history, "output": g.text} for g in finals])
    stats["reward_s"] = time.perf_counter() - t
    for s, r, rm, fmt in zip(samples, scores["rewards"], scores["rm_scores"], scores["format_rewards"]):
        s.reward, s.rm_score, s.format_reward = float(r), float(rm), float(fmt)
    stats.update(total_s=time.perf_counter() - t0, prompt1_tokens=len(p1),
                 stage1_tokens=sum(len(g.token_ids) for g in gens1),
                 stage2_tokens=sum(len(g.token_ids) for g in finals) if ro.rag else 0)
    if risk is not None:
        t = time.perf_counter()
        read = samples[:cfg.safety.rollout_metric_samples or None]  # safety.rollout_metric_samples
        stats.update(_risk_stats(risk, state.history, [s.output for s in read]), risk_checked=len(read))
        stats["risk_s"] = time.perf_counter() - t
    return ScoredGroup(state.state_id, samples, version, stats)


def _risk_stats(risk, history: list[dict], outputs: list[str]) -> dict:
    """Counts of high / elevated rollouts of one group (one ``assess_many`` over the group)."""
    counts = level_counts(risk.assess_many([with_answer(history, reply_text(o)) for o in outputs]))
    return {"risk_high": counts["high"], "risk_elevated": counts["elevated"]}


async def _stage2(state, sched, retriever, cfg: Config, msgs1: list[dict], p1: list[int],
                  gens1: list[Generation], seed: int, stats: dict):
    """Retrieve for every ĉ (never from the state's own dialogue), then sample c."""
    t = time.perf_counter()
    queries = [retrieval_query(g.text, state.history) for g in gens1]
    exemplars = await retrieve(retriever, queries, cfg.retriever.k, [state.dialogue_id] * len(queries))
    stats["retrieve_s"] = time.perf_counter() - t
    feedbacks = [feedback_ids(sched.tokenizer, msgs1, ex, g.ended_with_eos) for g, ex in zip(gens1, exemplars)]
    p2s = [p1 + g.token_ids + fb for g, fb in zip(gens1, feedbacks)]
    t = time.perf_counter()
    gens2 = await sched.generate(p2s, SamplingParams.from_config(cfg.rollout, 2),
                                 [derive_seed(seed, j, 2) for j in range(len(p2s))])
    stats["stage2_s"] = time.perf_counter() - t
    stats["prompt2_tokens"] = sum(len(p) for p in p2s)
    samples = [Sample(record(p1, g1, fb, g2, cfg.rollout.train_stage1), output=g2.text, initial_output=g1.text,
                      exemplar_ids=[str(e["id"]) for e in ex], stage1_format_ok=parse_output(g1.text).ok)
               for g1, g2, fb, ex in zip(gens1, gens2, feedbacks, exemplars)]
    return samples, gens2


async def run_groups(states: list[DialogueState], engine, retriever, reward, cfg: Config, version: int,
                     seeds: list[int] | None = None, risk=None) -> list[ScoredGroup]:
    """All states' groups concurrently on one engine (pipelined: while one group waits on HTTP the
    engine generates for another), in input order; ``seeds`` gives each group its seed."""
    sched = as_scheduler(engine, cfg.rollout.max_batch)
    seeds = seeds or [derive_seed(cfg.run.seed, version, s.state_id) for s in states]
    return list(await asyncio.gather(*(run_group(s, sched, retriever, reward, cfg, version, seed, risk)
                                       for s, seed in zip(states, seeds))))
