"""A defensive async JSON client for the project's services.

Owns: total timeout per call, bounded retries with exponential backoff on connection errors, 5xx and
503, no retry on other 4xx (the request itself is wrong), and a final ``ServiceError`` that names the
URL, the attempts and the last cause. The retriever and reward clients are thin wrappers over it.
"""

from __future__ import annotations

import asyncio

import httpx

from escrag.errors import ServiceError

__all__ = ["AsyncJsonClient", "ServiceError"]


class AsyncJsonClient:
    def __init__(self, base_url: str, api_key: str | None = None, timeout: float = 60.0,
                 retries: int = 3, backoff: float = 0.5):
        self.base_url = base_url.rstrip("/")
        self.timeout, self.retries, self.backoff = timeout, retries, backoff
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._headers = headers
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
        url = f"{self.base_url}{path}"
        cause = "no attempt made"
        for attempt in range(1, self.retries + 2):
            try:
                resp = await asyncio.wait_for(self._http().post(url, json=payload), self.timeout)
            except (httpx.TransportError, TimeoutError) as exc:
                cause = f"{type(exc).__name__}: {exc}"
            else:
                if resp.status_code < 400:
                    return resp.json()
                cause = f"HTTP {resp.status_code}: {resp.text[:500]}"
                if resp.status_code < 500 and resp.status_code != 429:
                    raise ServiceError(f"POST {url} rejected the request ({cause})")
            if attempt <= self.retries:
                await asyncio.sleep(self.backoff * 2 ** (attempt - 1))
        raise ServiceError(f"POST {url} failed after {self.retries + 1} attempts ({cause})")

    async def get(self, path: str) -> dict:
        resp = await self._http().get(f"{self.base_url}{path}")
        resp.raise_for_status()
        return resp.json()

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
