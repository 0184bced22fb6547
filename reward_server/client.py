"""The async client the rollout uses to score outputs on a reward server.

Owns: ``RewardClient``, a thin wrapper over ``escrag.http_client.AsyncJsonClient`` (total timeout per
call, bounded retries with backoff on connection errors, 5xx and 503, a final ``ServiceError`` naming
the URL). It also checks that the server answered one score per item.
"""

from __future__ import annotations

from escrag.http_client import AsyncJsonClient, ServiceError

KEYS = ("rewards", "rm_scores", "format_rewards")


class RewardClient:
    def __init__(self, url: str, api_key: str | None = None, timeout: float = 60.0, retries: int = 3):
        self.url = url
        self._http = AsyncJsonClient(url, api_key=api_key, timeout=timeout, retries=retries)

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
