"""The async client the rollout uses to score outputs on a reward server.

Owns: ``RewardClient``, a thin wrapper over ``escrag.web.client.AsyncJsonClient`` (timeout per
attempt, retries with backoff on connection errors, 429 and 5xx for up to ``reward.wait_s``, a final
``ServiceError`` naming the URL). It also checks that the server answered one score per item.
"""

from __future__ import annotations

import os

from escrag.config import RewardConfig
from escrag.web.client import AsyncJsonClient, ServiceError

KEYS = ("rewards", "rm_scores", "format_rewards")


class RewardClient:
    def __init__(self, url: str, rc: RewardConfig | None = None, api_key: str | None = None):
        """``rc`` gives timeout_s, wait_s and backoff_s (default: the config's defaults); the bearer
        token is ``api_key``, else ``$ESCRAG_API_KEY`` (the servers read the same variable)."""
        rc = rc or RewardConfig()
        self.url = url
        key = api_key if api_key is not None else os.environ.get("ESCRAG_API_KEY")
        self._http = AsyncJsonClient(url, key, rc.timeout_s, rc.wait_s, rc.backoff_s)

    async def score(self, items: list[dict]) -> dict:
        """items: [{"history": [messages], "output": str}] -> {"rewards", "rm_scores", "format_rewards"}."""
        if not items:
            return {k: [] for k in KEYS}
        out = await self._http.post("/score", {"items": items})
        if any(not isinstance(out.get(k), list) or len(out[k]) != len(items) for k in KEYS):
            raise ServiceError(f"POST {self.url}/score answered without {len(items)} values for each of "
                               f"{', '.join(KEYS)}")
        return {k: out[k] for k in KEYS}

    async def health(self) -> dict:
        return await self._http.get("/health")

    async def aclose(self) -> None:
        await self._http.aclose()
