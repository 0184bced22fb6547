"""The generation-engine interface every rollout backend implements, and the types they share.

Owns: ``SamplingParams`` (built from the config: ``SamplingParams.from_config``), ``Generation``,
``GenerationEngine`` (batched ``generate`` over token ids with one seed per row, ``load_weights``
with a monotonically increasing version), ``StaleWeightsError``, the shared stop-string helper,
``EngineScheduler`` (serialises engine calls from concurrent episodes and merges the ones that share
sampling parameters into one batch: for engines that batch one call at a time, i.e. vLLM here; the
transformers engine batches continuously on its own, ``HFEngine.scheduler``).
(The factory, ``make_engine``, is ``rollout.engines``'s.)

Sampling and log-probs are defined once in ``escrag.sampling``: a row's draw depends only on its
seed (never on the rest of the batch), and ``Generation.logprobs[t]`` is log-softmax(logits / T) at
the sampled token, the quantity the learner recomputes for the ratio of eq. 10.
"""

from __future__ import annotations

import abc
import asyncio
import random
from dataclasses import dataclass

from escrag.errors import UserError
from escrag.formats import RESPONSE_CLOSE


class ContextLengthError(UserError):
    """A prompt longer than the engine's context (``rollout.max_seq_len``): the caller's input, HTTP 400."""


class StaleWeightsError(ValueError):
    """``load_weights`` got a version that is not newer than the engine's current one."""


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int
    temperature: float  # 0: greedy
    top_p: float
    top_k: int  # 0: whole vocabulary; top-p then runs inside the top k
    stop_strings: tuple = (RESPONSE_CLOSE,)  # generation ends right after the first of these

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.top_k < 0:
            raise ValueError(f"bad sampling params: temperature={self.temperature}, "
                             f"top_p={self.top_p}, top_k={self.top_k}")

    @classmethod
    def from_config(cls, ro, stage: int, **changes) -> SamplingParams:
        """Stage 1 or 2 parameters from a ``RolloutConfig``; ``changes`` override fields."""
        fields = {"max_new_tokens": ro.max_new_tokens_stage1 if stage == 1 else ro.max_new_tokens_stage2,
                  "temperature": ro.temperature, "top_p": ro.top_p, "top_k": ro.top_k}
        return cls(**{**fields, **{k: v for k, v in changes.items() if v is not None}})


@dataclass
class Generation:
    token_ids: list[int]  # [L] completion ids only; includes the EOS token when generation hit it
    logprobs: list[float]  # [L] log-softmax(logits / T) of each sampled token (escrag.sampling)
    text: str  # decoded completion without special tokens, cut right after a stop string
    finish_reason: str  # "stop" (EOS or a stop string) or "length"
    ended_with_eos: bool = False  # the last token is an end-of-sequence token


class GenerationEngine(abc.ABC):
    """Batched sampling over token ids plus versioned weight loading."""

    version: int = 0  # weights version; 0 = the weights the engine was built with
    tokenizer = None
    _seed_rng: random.Random | None = None  # for rows without a seed; engines seed it at construction

    def row_seeds(self, n: int, seeds: list[int] | None) -> list[int]:
        """The given seeds (one per row), or ``n`` drawn from the engine's own generator."""
        if seeds is None:
            self._seed_rng = self._seed_rng or random.Random(0)
            return [self._seed_rng.getrandbits(32) for _ in range(n)]
        if len(seeds) != n:
            raise ValueError(f"{len(seeds)} seeds for {n} prompts")
        return [int(x) for x in seeds]

    @abc.abstractmethod
    def generate(self, prompt_ids: list[list[int]], params: SamplingParams,
                 seeds: list[int] | None = None) -> list[Generation]:
        """One ``Generation`` per prompt, in order; ``seeds`` gives each row its own seed (None: the
        engine draws them from its own generator, seeded at construction)."""

    @abc.abstractmethod
    def load_weights(self, weights: dict, version: int) -> None:
        """Replace the named parameters (a partial dict updates only those), then set ``version``."""

    def call(self, fn, *args):
        """Run ``fn(*args)`` where this engine runs its CPU torch work (``HFEngine``: its own thread,
        so that the process keeps one OpenMP pool); here, in the calling thread."""
        return fn(*args)

    def _check_version(self, version: int) -> None:
        if version <= self.version:
            raise StaleWeightsError(f"weights version {version} is not newer than the engine's "
                                    f"version {self.version}")


def stop_position(text: str, stop_strings: tuple) -> int | None:
    """End index of the earliest stop string in ``text`` (None when there is none)."""
    ends = [text.find(s) + len(s) for s in stop_strings if s and s in text]
    return min(ends) if ends else None


class EngineScheduler:
    """Lets concurrent episodes share one engine: calls run one at a time in a worker thread (so
    the event loop keeps serving retrieval and reward calls meanwhile), and requests that queue up
    with equal ``SamplingParams`` are merged into one batch of at most ``max_batch`` rows."""

    def __init__(self, engine: GenerationEngine, max_batch: int):
        """``max_batch``: ``rollout.max_batch``."""
        self.engine, self.max_batch = engine, max_batch
        self._pending: list[tuple[list, SamplingParams, list[int], asyncio.Future]] = []
        self._busy = False
        self.calls: list[tuple[int, SamplingParams]] = []  # (rows, params) of each engine call

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    async def generate(self, prompt_ids: list[list[int]], params: SamplingParams,
                       seeds: list[int] | None = None) -> list[Generation]:
        fut = asyncio.get_running_loop().create_future()
        seeds = self.engine.row_seeds(len(prompt_ids), seeds)  # drawn now: the order of calls decides
        self._pending.append((prompt_ids, params, seeds, fut))
        if not self._busy:
            self._busy = True
            asyncio.get_running_loop().create_task(self._drain())
        return await fut

    def _take_batch(self) -> tuple[list, SamplingParams]:
        params = self._pending[0][1]
        batch, rows, rest = [], 0, []
        for item in self._pending:
            fits = not batch or rows + len(item[0]) <= self.max_batch
            if item[1] == params and fits:
                batch.append(item)
                rows += len(item[0])
            else:
                rest.append(item)
        self._pending = rest
        return batch, params

    async def _drain(self) -> None:
        try:
            while self._pending:
                batch, params = self._take_batch()
                merged = [p for ids, _, _, _ in batch for p in ids]
                seeds = [x for _, _, row_seeds, _ in batch for x in row_seeds]
                self.calls.append((len(merged), params))
                try:
                    outs = await asyncio.to_thread(self.engine.generate, merged, params, seeds)
                except Exception as exc:  # every waiter of this batch sees the failure
                    for *_, fut in batch:
                        if not fut.done():
                            fut.set_exception(exc)
                    continue
                start = 0
                for ids, _, _, fut in batch:
                    if not fut.done():
                        fut.set_result(outs[start:start + len(ids)])
                    start += len(ids)
        finally:
            self._busy = False
