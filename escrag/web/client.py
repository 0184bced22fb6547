"""A defensive async JSON client for the project's services.

Owns: a total timeout per attempt, retries under ``escrag.web.retry.RetryPolicy`` (on connection
errors, timeouts, 429 and 5xx, with a backoff from ``backoff`` doubling up to 8x, or the server's
``Retry-After``) until the next wait would end past ``wait_s`` seconds since the first attempt; no
retry on other 4xx (the request itself is wrong); and a final ``ServiceError`` that names the URL, the
attempts, the time spent and the last cause. GET and POST behave the same. The retriever and reward
clients are thin wrappers over it.

Waiting by time rather than by a count of attempts is what lets a training job ride out a server
that dies and is restarted by the job (``ray_jobs.services``): the model reload takes seconds to
minutes, and the call goes through once it is back.
"""

from __future__ import annotations

import asyncio

import httpx

from escrag.errors import ServiceError
from escrag.web.retry import (
    MAX_BACKOFF_FACTOR,
    RETRY_ERRORS,
    GaveUp,
    Retryable,
    RetryPolicy,
    retry_after,
    retryable_status,
)

__all__ = ["AsyncJsonClient", "ServiceError"]

class AsyncJsonClient:
    def __init__(self, base_url: str, api_key: str | None, timeout: float, wait_s: float, backoff: float):
        """``timeout``, ``wait_s``, ``backoff``: the service's client section (``retriever.timeout_s`` ...)."""
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.policy = RetryPolicy(backoff, MAX_BACKOFF_FACTOR * backoff, deadline_s=wait_s)
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client: httpx.AsyncClient | None = None
        self._loop = None

    def _http(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:  # a client is bound to its event loop
            self._client = httpx.AsyncClient(headers=self._headers, timeout=self.timeout,
                                             limits=httpx.Limits(max_connections=256))
            self._loop = loop
        return self._client

    async def post(self, path: str, payload: dict) -> dict:
        return await self._call("POST", path, payload)

    async def get(self, path: str) -> dict:
        return await self._call("GET", path, None)

    async def _call(self, method: str, path: str, payload: dict | None) -> dict:
        url = f"{self.base_url}{path}"
        try:
            return await self.policy.run(lambda: self._attempt(method, url, payload))
        except GaveUp as exc:
            raise ServiceError(f"{method} {url} failed after {exc.attempts} attempt(s) over "
                               f"{exc.spent_s:.0f} s ({exc.cause})") from None

    async def _attempt(self, method: str, url: str, payload: dict | None):
        """The decoded answer; ``Retryable`` when worth retrying; ``ServiceError`` otherwise."""
        try:
            resp = await asyncio.wait_for(self._http().request(method, url, json=payload), self.timeout)
        except RETRY_ERRORS as exc:
            raise Retryable(f"{type(exc).__name__}: {exc}") from None
        if resp.status_code >= 400:
            cause = f"HTTP {resp.status_code}: {resp.text[:500]}"
            if not retryable_status(resp.status_code):
                raise ServiceError(f"{method} {url} rejected the request ({cause})")
            raise Retryable(cause, retry_after(resp))
        try:
            return resp.json()
        except ValueError:
            raise ServiceError(f"{method} {url} answered {resp.status_code} with a body that is not "
                               f"JSON: {resp.text[:200]!r}") from None

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

