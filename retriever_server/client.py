"""Async client of the retriever service, used by the rollout and the counselor API.

Owns: ``RetrieverClient.retrieve(queries, k)`` over ``escrag.http_client.AsyncJsonClient`` (total
timeout per call, bounded retries with backoff on connection errors and 5xx, a ``ServiceError``
naming the URL after the last try) plus a check that the answer has one hit list per query.
"""

from __future__ import annotations

from escrag.http_client import AsyncJsonClient, ServiceError


class RetrieverClient:
    def __init__(self, url: str, api_key: str | None = None, timeout: float = 30.0, retries: int = 3,
                 backoff: float = 0.5):
        self.url = url.rstrip("/")
        self._http = AsyncJsonClient(self.url, api_key=api_key, timeout=timeout, retries=retries,
                                     backoff=backoff)

    async def retrieve(self, queries: list[str], k: int = 3) -> list[list[dict]]:
        """Top-k exemplars per query, best first: dicts with id, history, response, score."""
        if not queries:
            return []
        answer = await self._http.post("/retrieve", {"queries": list(queries), "k": k, "return_scores": True})
        results = answer.get("results") if isinstance(answer, dict) else None
        if not isinstance(results, list) or len(results) != len(queries):
            raise ServiceError(f"POST {self.url}/retrieve: expected 'results' with {len(queries)} lists, "
                               f"got {str(answer)[:200]}")
        return results

    async def health(self) -> dict:
        return await self._http.get("/health")

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> RetrieverClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()
