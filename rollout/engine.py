"""The generation-engine interface every rollout backend implements.

Owns: ``SamplingParams``, ``Generation``, ``GenerationEngine`` (batched ``generate`` over token ids,
``load_weights`` with a monotonically increasing version), ``StaleWeightsError``, the shared
stop-string helper, ``EngineScheduler`` (serialises engine calls from concurrent episodes and merges
the ones that share sampling parameters into one batch) and ``make_engine`` (config -> engine).

Log-probs: ``Generation.logprobs[t]`` is the log-softmax of the *raw* logits (temperature 1.0, before
top-k/top-p truncation) at the sampled token, i.e. log π_old(token | context). The learner recomputes
the same quantity under the current weights for the ratio of eq. 10; the sampling distribution
(temperature, truncation) only decides which tokens are drawn.
"""

from __future__ import annotations

import abc
import asyncio
from dataclasses import dataclass


class StaleWeightsError(ValueError):
    """``load_weights`` got a version that is not newer than the engine's current one."""


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int
    temperature: float = 0.9  # 0: greedy
    top_p: float = 0.95
    top_k: int = 64  # 0: whole vocabulary; top-p then runs inside the top k
    seed: int | None = None  # None: the engine's own generator (seeded once at construction)
    stop_strings: tuple = ("</response>",)  # generation ends right after the first of these

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.top_k < 0:
            raise ValueError(f"bad sampling params: temperature={self.temperature}, "
                             f"top_p={self.top_p}, top_k={self.top_k}")


@dataclass
class Generation:
    token_ids: list[int]  # [L] completion ids only; includes the EOS token when generation hit it
    logprobs: list[float]  # [L] raw (temperature-1) log-prob of each sampled token, see module doc
    text: str  # decoded completion without special tokens, cut right after a stop string
    finish_reason: str  # "stop" (EOS or a stop string) or "length"


class GenerationEngine(abc.ABC):
    """Batched sampling over token ids plus versioned weight loading."""

    version: int = 0  # weights version; 0 = the weights the engine was built with
    tokenizer = None

    @abc.abstractmethod
    def generate(self, prompt_ids: list[list[int]], params: SamplingParams) -> list[Generation]:
        """One ``Generation`` per prompt, in order."""

    @abc.abstractmethod
    def load_weights(self, weights: dict, version: int) -> None:
        """Replace the named parameters (a partial dict updates only those), then set ``version``."""

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

    def __init__(self, engine: GenerationEngine, max_batch: int = 64):
        self.engine, self.max_batch = engine, max_batch
        self._pending: list[tuple[list, SamplingParams, asyncio.Future]] = []
        self._busy = False
        self.calls: list[tuple[int, SamplingParams]] = []  # (rows, params) of each engine call

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    async def generate(self, prompt_ids: list[list[int]], params: SamplingParams) -> list[Generation]:
        fut = asyncio.get_running_loop().create_future()
        self._pending.append((prompt_ids, params, fut))
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
                merged = [p for ids, _, _ in batch for p in ids]
                self.calls.append((len(merged), params))
                try:
                    outs = await asyncio.to_thread(self.engine.generate, merged, params)
                except Exception as exc:  # every waiter of this batch sees the failure
                    for _, _, fut in batch:
                        if not fut.done():
                            fut.set_exception(exc)
                    continue
                start = 0
                for ids, _, fut in batch:
                    if not fut.done():
                        fut.set_result(outs[start:start + len(ids)])
                    start += len(ids)
        finally:
            self._busy = False


def make_engine(cfg, model_spec: str | None = None, seed: int | None = None) -> GenerationEngine:
    """The engine ``cfg.rollout.engine`` names, for ``model_spec`` (default ``cfg.policy.model``)."""
    spec = model_spec or cfg.policy.model
    seed = cfg.run.seed if seed is None else seed
    if cfg.rollout.engine == "vllm":
        from rollout.vllm_engine import VLLMEngine

        return VLLMEngine(spec, dtype=cfg.policy.dtype, seed=seed,
                          gpu_memory_utilization=cfg.rollout.vllm_gpu_memory)
    from rollout.hf_engine import HFEngine

    return HFEngine(spec, dtype=cfg.policy.dtype, device=cfg.rollout.device, seed=seed)
