"""The one retry policy of every outbound HTTP client (``escrag.web.client.AsyncJsonClient`` and
``escrag.llm.endpoint.ChatEndpoint``).

Owns: what is worth retrying (connection errors, timeouts, 429 and any 5xx; never another 4xx: the
request itself is wrong), the wait before each retry, how ``Retry-After`` is read, and the attempt
loop ``RetryPolicy.run``, which stops after ``attempts`` attempts or when the next wait would end past
``deadline_s`` since the first attempt, whichever comes first.

The wait after failed attempt n: ``base_s * 2**(n-1)`` (times a jitter in [0.5, 1] when ``jitter``),
capped at ``max_s``. A usable ``Retry-After`` replaces it, capped at ``max_s`` too. Usable means
delta-seconds (``"2"``, ``"0.5"``) or an HTTP date (the seconds from now until then); anything else
(absent, garbage such as ``"soon"``, a negative number, a date already past) is None: the backoff
applies. The two clients used to read the header each their own way (garbage: 0 or None; a negative
number: 0, so the chat client retried at once; dates: ignored by both; the JSON client kept its
backoff as a floor under the header and did not cap it).
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC
from email.utils import parsedate_to_datetime
from typing import TypeVar

import httpx

T = TypeVar("T")
RETRY_ERRORS = (httpx.TransportError, TimeoutError)  # no answer: connection refused or reset, timeouts
MAX_BACKOFF_FACTOR = 8  # AsyncJsonClient's cap is 8x its backoff (its configs have no max_backoff_s)
JITTER = (0.5, 1.0)  # range of the random factor of a jittered backoff
_MAX_DOUBLINGS = 64  # the exponent stops growing here, so a long deadline-bound loop cannot overflow


class Retryable(Exception):
    """Raised by an attempt that may succeed when repeated; ``retry_after``: the server's ask, or None."""

    def __init__(self, cause: str, retry_after: float | None = None):
        super().__init__(cause)
        self.retry_after = retry_after


class GaveUp(Exception):
    """The attempts or the deadline ran out; ``cause`` is the last attempt's ``Retryable`` message."""

    def __init__(self, attempts: int, spent_s: float, cause: str):
        super().__init__(cause)
        self.attempts, self.spent_s, self.cause = attempts, spent_s, cause


def retryable_status(status: int) -> bool:
    return status == 429 or status >= 500


def retry_after(resp: httpx.Response) -> float | None:
    """Seconds the server asked us to wait, or None (absent, unparsable, negative, past)."""
    value = resp.headers.get("retry-after", "").strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        seconds = when.replace(tzinfo=when.tzinfo or UTC).timestamp() - time.time()  # HTTP dates are GMT
    return seconds if seconds >= 0 else None


@dataclass(frozen=True)
class RetryPolicy:
    base_s: float  # wait after the first failed attempt; doubles after each further one
    max_s: float  # cap on any wait, Retry-After included
    attempts: int | None = None  # most attempts of one call; None: only the deadline bounds them
    deadline_s: float | None = None  # no wait may end later than this after the first attempt started
    jitter: bool = False  # multiply the backoff by a random factor in JITTER (not a Retry-After)

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        """Seconds to wait after failed attempt ``attempt`` (1-based)."""
        if retry_after is not None:
            return min(retry_after, self.max_s)
        wait = self.base_s * 2 ** min(attempt - 1, _MAX_DOUBLINGS)
        return min(wait * random.uniform(*JITTER) if self.jitter else wait, self.max_s)

    async def run(self, attempt: Callable[[], Awaitable[T]]) -> T:
        """``await attempt()`` until it returns. A ``Retryable`` it raises is retried after ``delay``
        while the policy allows, then becomes ``GaveUp``; any other exception propagates at once."""
        start = time.monotonic()
        for n in itertools.count(1):
            try:
                return await attempt()
            except Retryable as exc:
                wait, spent = self.delay(n, exc.retry_after), time.monotonic() - start
                if (self.attempts is not None and n >= self.attempts) or \
                        (self.deadline_s is not None and spent + wait > self.deadline_s):
                    raise GaveUp(n, spent, str(exc)) from None
            await asyncio.sleep(wait)
