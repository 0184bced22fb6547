"""Async client of OpenAI-compatible chat endpoints: limits, retries, accounting, a record of every call.

Owns: ``ChatEndpoint`` (one configured endpoint; ``await chat(messages, ...)`` -> ``ChatResult``),
``CallLog`` (the append-only JSONL record of every call and the running token and cost totals, which
progress bars show) and ``EndpointError``. The judge, the evaluation's systems and preference
construction all reach LLMs through it; the config section is ``escrag.config.EndpointConfig``.

One call: wait for a concurrency slot (``max_concurrency``) and, per attempt, a start slot
(``requests_per_minute``: starts are spaced 60/rpm seconds apart, so a burst never trips the
provider's limit), then ``POST {base_url}/chat/completions`` with a total timeout per attempt.
Connection errors, timeouts, 429, 5xx and a 200 without ``choices[0].message.content`` are retried up
to ``retries`` times under ``escrag.web.retry.RetryPolicy`` (``backoff_s`` doubling, times a jitter in
[0.5, 1], capped at ``max_backoff_s``; a usable ``Retry-After`` replaces the backoff). Any other 4xx
fails at once: the request itself is wrong. The concurrency slot is released while a call sleeps
between attempts. Tokens come from the response's
``usage``; cost = tokens x the configured USD price per million. Each call (not each attempt) is one
JSON line in the log: request, response or error, every attempt's status and latency, tokens, cost.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from escrag.atomic import json_text
from escrag.config import EndpointConfig
from escrag.errors import ServiceError, UserError
from escrag.web.retry import RETRY_ERRORS, GaveUp, Retryable, RetryPolicy, retry_after, retryable_status


class EndpointError(ServiceError):
    """A chat call failed for good; ``status`` is the last HTTP status (None: no answer)."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


@dataclass
class ChatResult:
    text: str  # choices[0].message.content
    raw: dict  # the whole response body (extra fields such as the counselor's ``escrag`` included)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0  # USD
    latency_s: float = 0.0  # first attempt's start to the answer, waits included
    attempts: int = 1


@dataclass
class _Totals:
    calls: int = 0
    failed: int = 0
    attempts: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    without_usage: int = 0  # answers that carried no ``usage`` (tokens and cost unknown)


@dataclass
class CallLog:
    """Every call of every endpoint sharing this log: a JSONL file (optional) and running totals."""

    path: str | Path | None = None
    totals: dict[str, _Totals] = field(default_factory=dict)

    def __post_init__(self):
        self._lock = threading.Lock()
        self._fh = None
        if self.path is not None:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            self._fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (closed in close())

    def record(self, endpoint: str, entry: dict, result: ChatResult | None) -> None:
        with self._lock:
            t = self.totals.setdefault(endpoint, _Totals())
            t.calls += 1
            t.attempts += len(entry["attempts"])
            t.failed += result is None
            for a in entry["attempts"]:  # every billed attempt, a garbage 200 that was retried too
                t.prompt_tokens += a.get("prompt_tokens", 0)
                t.completion_tokens += a.get("completion_tokens", 0)
                t.cost += a.get("cost", 0.0)
            if result is not None:
                t.without_usage += "usage" not in result.raw
            if self._fh is not None:
                self._fh.write(json_text({"endpoint": endpoint, **entry}) + "\n")
                self._fh.flush()

    @property
    def calls(self) -> int:
        return sum(t.calls for t in self.totals.values())

    @property
    def cost(self) -> float:
        return sum(t.cost for t in self.totals.values())

    def summary(self) -> dict:
        return {name: vars(t).copy() for name, t in sorted(self.totals.items())}

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


class ChatEndpoint:
    """``await ChatEndpoint(name, cfg, log).chat(messages, temperature=0, max_tokens=200)``."""

    def __init__(self, name: str, cfg: EndpointConfig, log: CallLog | None = None):
        if not cfg.base_url or not cfg.model:
            raise UserError(f"endpoints.{name}: base_url and model are required")
        self.name, self.cfg, self.log = name, cfg, log or CallLog()
        self.policy = RetryPolicy(cfg.backoff_s, cfg.max_backoff_s, attempts=cfg.retries + 1, jitter=True)
        self.url = cfg.base_url.rstrip("/") + "/chat/completions"
        headers = {}
        if cfg.api_key_env:
            key = os.environ.get(cfg.api_key_env)
            if not key:
                raise UserError(f"endpoints.{name}.api_key_env: environment variable {cfg.api_key_env} "
                                "is not set")
            headers["Authorization"] = f"Bearer {key}"
        self._headers = headers
        self._loop = None
        self._client: httpx.AsyncClient | None = None
        self._next_start = 0.0

    def _bind(self) -> None:
        """httpx clients and asyncio primitives belong to one event loop: make them for this one."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._loop = loop
            self._client = httpx.AsyncClient(headers=self._headers, timeout=self.cfg.timeout_s,
                                             limits=httpx.Limits(max_connections=self.cfg.max_concurrency))
            self._slots = asyncio.Semaphore(self.cfg.max_concurrency)
            self._rate = asyncio.Lock()

    async def _start_slot(self) -> None:
        if not self.cfg.requests_per_minute:
            return
        async with self._rate:
            now = time.monotonic()
            wait = self._next_start - now
            self._next_start = max(now, self._next_start) + 60.0 / self.cfg.requests_per_minute
        if wait > 0:
            await asyncio.sleep(wait)

    async def _attempt(self, body: dict, attempts: list[dict]) -> dict:
        """One POST: the response body; ``Retryable`` for an answer worth repeating, ``EndpointError`` for
        one that must not be. The attempt's record goes on ``attempts`` (a rejected one's: by ``chat``)."""
        async with self._slots:
            await self._start_slot()
            t0 = time.monotonic()
            try:
                resp = await asyncio.wait_for(self._client.post(self.url, json=body), self.cfg.timeout_s)
            except RETRY_ERRORS as exc:
                name = type(exc).__name__
                attempts.append({"status": None, "error": f"{name}: {exc}" if str(exc) else name,
                                 "latency_s": round(time.monotonic() - t0, 4)})
                raise Retryable(attempts[-1]["error"]) from None
        rec = {"status": resp.status_code, "latency_s": round(time.monotonic() - t0, 4)}
        if resp.status_code >= 400:
            if not retryable_status(resp.status_code):
                raise EndpointError(f"POST {self.url} rejected the request (HTTP {resp.status_code}: "
                                    f"{resp.text[:300]})", resp.status_code)
            attempts.append({**rec, "error": resp.text[:500]})
            raise Retryable(resp.text[:500], retry_after(resp))
        try:
            data = resp.json()
        except ValueError:
            data = None
        rec.update(self._billed(data))
        attempts.append(rec)
        try:
            if not isinstance(data["choices"][0]["message"]["content"], str):
                raise TypeError("content is not a string")
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            rec["error"] = f"answer without choices[0].message.content ({exc}): {resp.text[:300]}"
            raise Retryable(rec["error"]) from None
        return data

    def _billed(self, data) -> dict:
        """What one answered attempt cost: its ``usage`` (absent: nothing known), which must hold
        non-negative integer token counts, else the call is an error (a provider's accounting is not
        trusted blindly: a negative count would lower the spent budget)."""
        usage = data.get("usage") if isinstance(data, dict) else None
        if usage is None:
            return {}
        counts = [usage.get(k, 0) for k in ("prompt_tokens", "completion_tokens")] if isinstance(usage, dict) else []
        if len(counts) != 2 or any(not isinstance(n, int) or isinstance(n, bool) or n < 0 for n in counts):
            raise EndpointError(f"POST {self.url} answered with an invalid usage {str(usage)[:200]!r} "
                                f"(token counts must be non-negative integers)")
        pt, ct = counts
        return {"prompt_tokens": pt, "completion_tokens": ct,
                "cost": (pt * self.cfg.price_input_per_m + ct * self.cfg.price_output_per_m) / 1e6}

    def _result(self, data: dict, t0: float, attempts: list[dict]) -> ChatResult:
        """The answer, with the tokens and cost of every billed attempt of the call."""
        pt, ct = (sum(a.get(k, 0) for a in attempts) for k in ("prompt_tokens", "completion_tokens"))
        return ChatResult(data["choices"][0]["message"]["content"], data, pt, ct,
                          sum(a.get("cost", 0.0) for a in attempts), time.monotonic() - t0, len(attempts))

    async def chat(self, messages: list[dict], *, temperature: float | None = None,
                   max_tokens: int | None = None, seed: int | None = None, tag: str | None = None,
                   **extra) -> ChatResult:
        """One chat completion. ``extra`` goes into the request body as is (``top_p``,
        ``response_format``, ...); ``tag`` only labels the call in the log."""
        self._bind()
        params = {"temperature": temperature, "max_tokens": max_tokens, "seed": seed, **extra}
        body = {"model": self.cfg.model, "messages": messages,
                **{k: v for k, v in params.items() if v is not None}}
        t0, attempts = time.monotonic(), []
        try:
            data = await self.policy.run(lambda: self._attempt(body, attempts))
        except EndpointError as exc:
            attempts.append({"status": exc.status, "error": str(exc)})
            self._record(tag, body, attempts, error=str(exc))
            raise
        except GaveUp:
            status, error = attempts[-1]["status"], attempts[-1]["error"]
            message = (f"POST {self.url} failed after {len(attempts)} attempts "
                       f"(last: {'HTTP ' + str(status) if status else 'no answer'}: {error[:300]})")
            self._record(tag, body, attempts, error=message)
            raise EndpointError(message, status) from None
        result = self._result(data, t0, attempts)
        self._record(tag, body, attempts, result=result)
        return result

    def _record(self, tag, body, attempts, result: ChatResult | None = None, error: str | None = None):
        entry = {"time": time.time(), "tag": tag, "request": body, "attempts": attempts}
        if result is not None:
            entry.update(response=result.raw, latency_s=round(result.latency_s, 4),
                         prompt_tokens=result.prompt_tokens, completion_tokens=result.completion_tokens,
                         cost=result.cost)
        else:
            entry["error"] = error
        self.log.record(self.name, entry, result)

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
            self._loop = None
