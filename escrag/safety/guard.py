"""A guard model in the crisis check's path (``safety.guard``): ``Guard`` and ``combine``.

Owns: reading a guard's verdict from an OpenAI-compatible chat endpoint (``chat_kind`` llama_guard:
"safe" / "unsafe\\nS11" as Llama Guard answers; levels: any chat model asked for a level and a category)
and/or an OpenAI-moderations-shaped endpoint (``POST {moderation_url}/moderations``, its
``category_scores``), and ``combine`` (the higher level wins). A guard that times out or fails gives
``None``: the embedded verdict stays in force, and ``failures`` counts it (the counselor's ``/metrics``).
Chat calls go through ``escrag.llm.endpoint.ChatEndpoint``; moderation calls use the same retry policy
(``escrag.web.retry``). Not in the paper.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections import Counter
from dataclasses import replace

import httpx

from escrag.config import EndpointConfig, GuardConfig
from escrag.errors import ServiceError, UserError
from escrag.llm.endpoint import ChatEndpoint
from escrag.safety.types import LEVELS, RiskAssessment
from escrag.web.retry import RETRY_ERRORS, GaveUp, Retryable, RetryPolicy, retry_after, retryable_status

LLAMA_GUARD = {"S1": "harm_to_others", "S3": "abuse", "S4": "abuse", "S11": "suicide"}  # hazard -> category
MODERATION = {"self-harm": "self_harm", "self-harm/intent": "suicide", "self-harm/instructions": "self_harm",
              "violence": "harm_to_others"}
LEVELS_PROMPT = ("You screen messages sent to an emotional-support chat for crisis risk. Read the user's turns and "
                 "answer with one line: a level (none, elevated or high) and, unless none, one category "
                 "(suicide, self_harm, harm_to_others, abuse, medical). high: a person is in danger now.")


def combine(embedded: RiskAssessment, guard: RiskAssessment | None) -> RiskAssessment:
    """The higher level wins; at equal levels the categories and reasons are joined."""
    if guard is None or LEVELS.index(guard.level) < LEVELS.index(embedded.level):
        return embedded
    if guard.level != embedded.level:
        return guard
    cats = list(dict.fromkeys(embedded.categories + guard.categories))
    return RiskAssessment(embedded.level, cats, embedded.reasons + guard.reasons, embedded.firm)


def _transcript(history: list[dict]) -> str:
    return "\n".join(f"{m['role']}: {m['content']}" for m in history)


def read_llama_guard(text: str) -> RiskAssessment:
    """``safe`` -> none; ``unsafe`` with S11 / S1 / S3 / S4 -> high in that category; other hazards -> elevated."""
    words = text.strip().split()
    if not words or words[0].lower() not in ("safe", "unsafe"):
        raise ServiceError(f"the guard answered {text[:80]!r}, not safe / unsafe")
    if words[0].lower() == "safe":
        return RiskAssessment()
    codes = re.findall(r"S\d+", text)
    cats = list(dict.fromkeys(LLAMA_GUARD[c] for c in codes if c in LLAMA_GUARD))
    return RiskAssessment("high" if cats else "elevated", cats, [f"guard: unsafe {','.join(codes)}"])


def read_levels(text: str) -> RiskAssessment:
    """``high suicide`` / ``elevated`` / ``none``: the first level named, then a category."""
    low = text.lower()
    level = next((w for w in re.findall(r"[a-z_]+", low) if w in LEVELS), None)
    if level is None:
        raise ServiceError(f"the guard answered {text[:80]!r}, naming no level")
    cats = [c for c in ("suicide", "self_harm", "harm_to_others", "abuse", "medical") if c in low]
    return RiskAssessment(level, cats if level != "none" else [], [f"guard: {text.strip()[:80]}"])


def read_moderation(data: dict, gc: GuardConfig) -> RiskAssessment:
    """The highest self-harm / violence score of ``results[0]``: >= ``moderation_high`` high, >= ``moderation_elevated`` elevated."""
    try:
        scores = data["results"][0]["category_scores"]
        found = {cat: float(scores.get(name, 0.0)) for name, cat in MODERATION.items()}
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
        raise ServiceError(f"the moderation answer has no results[0].category_scores ({exc})") from None
    for level, cut in (("high", gc.moderation_high), ("elevated", gc.moderation_elevated)):
        cats = sorted({c for c, s in found.items() if s >= cut}, key=lambda c: -found[c])
        if cats:
            return RiskAssessment(level, cats, [f"moderation: {c} {found[c]:.2f}" for c in cats])
    return RiskAssessment()


class Guard:
    """``await guard.assess(history)`` -> the guard's combined verdict, or None when every guard failed."""

    def __init__(self, gc: GuardConfig, on_failure=None):
        if not gc.chat_url and not gc.moderation_url:
            raise UserError("safety.guard: give chat_url and/or moderation_url")
        if gc.chat_url and not gc.chat_model:
            raise UserError("safety.guard.chat_model: required with chat_url")
        self.gc, self.failures, self.on_failure = gc, Counter(), on_failure  # on_failure(kind): a metric
        ecfg = EndpointConfig(timeout_s=gc.timeout_s, retries=gc.retries, max_concurrency=gc.max_concurrency,
                              max_backoff_s=gc.timeout_s)
        self.chat = (ChatEndpoint("guard", replace(ecfg, base_url=gc.chat_url, model=gc.chat_model,
                                                   api_key_env=gc.api_key_env)) if gc.chat_url else None)
        self.policy = RetryPolicy(ecfg.backoff_s, gc.timeout_s, attempts=gc.retries + 1, jitter=True)
        key = os.environ.get(gc.api_key_env or "") if gc.api_key_env else None
        if gc.api_key_env and not key:
            raise UserError(f"safety.guard.api_key_env: environment variable {gc.api_key_env} is not set")
        self._headers = {"Authorization": f"Bearer {key}"} if key else {}

    async def assess(self, history: list[dict]) -> RiskAssessment | None:
        parts = [(kind, fn(history)) for kind, fn in (("chat", self._chat), ("moderation", self._moderation))
                 if getattr(self.gc, f"{kind}_url")]
        verdicts = []
        for kind, result in zip([k for k, _ in parts], await asyncio.gather(*(c for _, c in parts),
                                                                               return_exceptions=True)):
            if isinstance(result, BaseException):
                self.failures[kind] += 1
                if self.on_failure is not None:
                    self.on_failure(kind)
            else:
                verdicts.append(result)
        out = None
        for v in verdicts:
            out = v if out is None else combine(out, v)
        return out

    async def _chat(self, history: list[dict]) -> RiskAssessment:
        if self.gc.chat_kind == "llama_guard":  # its chat template frames the conversation itself
            messages = [{"role": m["role"], "content": m["content"]} for m in history]
            return read_llama_guard((await self.chat.chat(messages, temperature=0.0, max_tokens=20, tag="guard")).text)
        messages = [{"role": "system", "content": LEVELS_PROMPT}, {"role": "user", "content": _transcript(history)}]
        return read_levels((await self.chat.chat(messages, temperature=0.0, max_tokens=20, tag="guard")).text)

    async def _moderation(self, history: list[dict]) -> RiskAssessment:
        text = "\n".join(m["content"] for m in history if m["role"] == "user")
        body = {"model": self.gc.moderation_model, "input": text}
        url = self.gc.moderation_url.rstrip("/") + "/moderations"
        async with httpx.AsyncClient(headers=self._headers, timeout=self.gc.timeout_s) as client:
            async def attempt():
                try:
                    resp = await client.post(url, json=body)
                except RETRY_ERRORS as exc:
                    raise Retryable(type(exc).__name__) from None
                if resp.status_code >= 400:
                    if retryable_status(resp.status_code):
                        raise Retryable(f"HTTP {resp.status_code}", retry_after(resp))
                    raise ServiceError(f"POST {url}: HTTP {resp.status_code}")
                return resp.json()
            try:
                data = await self.policy.run(attempt)
            except GaveUp as exc:
                raise ServiceError(f"POST {url} failed: {exc}") from None
        return read_moderation(data, self.gc)

    @classmethod
    def from_config(cls, sc, on_failure=None) -> Guard | None:
        """The guard ``safety.guard`` names, or None when it names no endpoint."""
        gc = sc.guard
        return cls(gc, on_failure) if gc.chat_url or gc.moderation_url else None

    def assess_all(self, histories: list[list[dict]]) -> list[RiskAssessment | None]:
        """``assess`` of each conversation, concurrently (the endpoints' limits hold), from sync code."""
        async def run():
            try:
                return await asyncio.gather(*(self.assess(h) for h in histories))
            finally:
                await self.aclose()
        return asyncio.run(run())

    async def aclose(self) -> None:
        if self.chat is not None:
            await self.chat.aclose()
