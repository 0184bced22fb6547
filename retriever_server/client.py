"""Async client of the retriever service, used by the rollout and the counselor API.

Owns: ``RetrieverClient.retrieve(queries, k, exclude_dialogue_ids)`` over
``escrag.web.client.AsyncJsonClient`` (timeout per attempt, retries with backoff on connection errors,
429 and 5xx for up to ``retriever.wait_s``, a ``ServiceError`` naming the URL after the last try) plus
a check of the answer against ``protocol.RetrieveResponse`` (one hit list per query, every hit with
its labels: a server of an older version is named as such, not read as empty labels).
"""

from __future__ import annotations

import os

from pydantic import ValidationError

from escrag.config import RetrieverConfig
from escrag.web.client import AsyncJsonClient, ServiceError
from retriever_server.protocol import RetrieveResponse


class RetrieverClient:
    def __init__(self, url: str, rc: RetrieverConfig | None = None, api_key: str | None = None):
        """``rc`` gives timeout_s, wait_s and backoff_s (default: the config's defaults); the bearer
        token is ``api_key``, else ``$ESCRAG_API_KEY`` (the servers read the same variable)."""
        rc = rc or RetrieverConfig()
        self.url = url.rstrip("/")
        key = api_key if api_key is not None else os.environ.get("ESCRAG_API_KEY")
        self._http = AsyncJsonClient(self.url, key, rc.timeout_s, rc.wait_s, rc.backoff_s)

    async def retrieve(self, queries: list[str], k: int, exclude_dialogue_ids: list[str | None] | None = None
                       ) -> list[list[dict]]:
        """Top-k exemplars per query, best first: dicts with the fields of ``protocol.Hit`` (id, history,
        response, strategies, stage, problem, emotion, score); none from the dialogue
        ``exclude_dialogue_ids[i]`` names for query i."""
        if not queries:
            return []
        payload = {"queries": list(queries), "k": k, "return_scores": True}
        if exclude_dialogue_ids and any(exclude_dialogue_ids):
            payload["exclude_dialogue_ids"] = list(exclude_dialogue_ids)
        answer = await self._http.post("/retrieve", payload)
        try:
            results = RetrieveResponse.model_validate(answer).model_dump(exclude_none=True)["results"]
        except ValidationError as exc:
            raise ServiceError(f"POST {self.url}/retrieve: not a retriever answer of this version "
                               f"({str(exc).splitlines()[0]}; got {str(answer)[:200]})") from None
        if len(results) != len(queries):
            raise ServiceError(f"POST {self.url}/retrieve: expected {len(queries)} hit lists, got {len(results)}")
        return results

    async def health(self) -> dict:
        return await self._http.get("/health")

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> RetrieverClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()
