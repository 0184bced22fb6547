"""A defensive async JSON client for the project's services.

Owns: a total timeout per attempt, retries with exponential backoff (``backoff``, doubling up to 8x)
on connection errors, 429 and 5xx, honouring the server's ``Retry-After``, until ``wait_s`` seconds
have passed since the first attempt; no retry on other 4xx (the request itself is wrong); and a final
``ServiceError`` that names the URL, the attempts, the time spent and the last cause. GET and POST
behave the same. The retriever and reward clients are thin wrappers over it.

Waiting by time rather than by a count of attempts is what lets a training job ride out a server
that dies and is restarted by the job (``ray_jobs.services``): the model reload takes seconds to
minutes, and the call goes through once it is back.
"""

from __future__ import annotations

import asyncio
import time

import httpx

from escrag.errors import ServiceError

__all__ = ["AsyncJsonClient", "ServiceError"]

RETRY_STATUS = (429, 500, 502, 503, 504)


class AsyncJsonClient:
    def __init__(self, base_url: str, api_key: str | None = None, timeout: float = 60.0,
                 wait_s: float = 60.0, backoff: float = 0.5):
        self.base_url = base_url.rstrip("/")
        self.timeout, self.wait_s, self.backoff = timeout, wait_s, backoff
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client: httpx.AsyncClient | None = None
        self._loop = None
        self.retries = 0  # attempts that were retried, over this client's life (for metrics)

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
        url, start, attempt = f"{self.base_url}{path}", time.monotonic(), 0
        while True:
            attempt += 1
            delay, cause = await self._attempt(method, url, payload)
            if delay is None:
                return cause  # the decoded answer
            delay = max(delay, self.backoff * 2 ** min(attempt - 1, 3))
            if time.monotonic() - start + delay > self.wait_s:
                raise ServiceError(f"{method} {url} failed after {attempt} attempt(s) over "
                                   f"{time.monotonic() - start:.0f} s ({cause})")
            self.retries += 1
            await asyncio.sleep(delay)

    async def _attempt(self, method: str, url: str, payload: dict | None):
        """(None, answer) on success; (minimum delay, cause) when worth retrying; raises otherwise."""
        try:
            resp = await asyncio.wait_for(self._http().request(method, url, json=payload), self.timeout)
        except (httpx.TransportError, TimeoutError) as exc:
            return 0.0, f"{type(exc).__name__}: {exc}"
        if resp.status_code < 400:
            try:
                return None, resp.json()
            except ValueError:
                raise ServiceError(f"{method} {url} answered {resp.status_code} with a body that is not "
                                   f"JSON: {resp.text[:200]!r}") from None
        cause = f"HTTP {resp.status_code}: {resp.text[:500]}"
        if resp.status_code not in RETRY_STATUS:
            raise ServiceError(f"{method} {url} rejected the request ({cause})")
        return _retry_after(resp), cause

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None


def _retry_after(resp: httpx.Response) -> float:
    """Seconds the server asked us to wait (``Retry-After`` in seconds), else 0."""
    try:
        return max(0.0, float(resp.headers.get("retry-after", 0)))
    except ValueError:
        return 0.0
