"""The reward server's logic: r = r_RM + r_format for batches of (history, output) (paper eq. 5).

Owns: ``RewardService``. Each item's output is parsed once: the format reward comes from
``escrag.formats.format_reward``; the scorer sees ``escrag.formats.response_text`` (the ``<response>``
block when the format parses, else the whole output), or the whole output for a rule that reads it. Items of concurrent requests are coalesced by
``escrag.web.batching.MicroBatcher`` into scorer batches of at most ``max_batch``; when more than
``max_queue`` items wait, ``score`` raises ``QueueFull`` (HTTP 503 + Retry-After).

The scorer is the reward model (``RewardModel.score``) or a rule from ``reward_server.rules``; both
take a list of (history, response text) and return (scores, truncated flags). No torch import here.
"""

from __future__ import annotations

from collections.abc import Callable

from escrag.errors import UserError
from escrag.formats import format_reward, response_text
from escrag.web.batching import MicroBatcher, QueueFull
from reward_server.protocol import prompt_history, query_output

Scorer = Callable[[list[tuple[list[dict], str]]], tuple[list[float], list[bool]]]
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def rule_scorer(rule) -> Scorer:
    def score(items):
        return [float(rule(h, text)) for h, text in items], [False] * len(items)

    return score


class RewardService:
    def __init__(self, scorer: Scorer, name: str, rc, info: dict | None = None, reads_output: bool = False):
        """``rc`` is the ``RewardConfig`` (micro-batching and queue limits); ``reads_output``: the
        scorer sees the whole output, not its response text."""
        self.scorer, self.name, self.rc, self.max_queue = scorer, name, rc, rc.max_queue
        self.view = (lambda o: o) if reads_output else response_text
        self.check = lambda history: None  # a rule's check of one item's history (UserError), before batching
        self.batcher = MicroBatcher(self._run_batch, rc.max_batch, rc.max_wait_ms, rc.max_queue,
                                    on_batch=self._on_batch)
        self._info = {"scorer": name, "max_batch": rc.max_batch, "max_wait_ms": rc.max_wait_ms,
                      "max_queue": rc.max_queue, **(info or {})}
        self.stats = {"items": 0, "batches": 0, "truncations": 0, "queue_full": 0}
        self._prom = None

    @classmethod
    def from_rule(cls, spec: str, rc) -> RewardService:
        from reward_server.rules import parse_rule

        rule = parse_rule(spec)
        service = cls(rule_scorer(rule), f"rule:{spec}", rc, reads_output=getattr(rule, "reads_output", False))
        service.check = getattr(rule, "check", service.check)
        return service

    @classmethod
    def from_rm(cls, head_dir: str, rc, backbone: str | None = None) -> RewardService:
        from reward_server.model import RewardModel

        rm = RewardModel.load(head_dir, backbone, rc.device)
        info = {"backbone": rm.manifest["backbone"], "max_length": rm.manifest["max_length"],
                "head_dir": str(head_dir)}
        return cls(rm.score, "rm", rc, info)

    def attach_metrics(self, metrics) -> None:
        """Export batch sizes, items, truncations and 503s on an ``escrag.web.serving.AppMetrics``."""
        self._prom = {
            "items": metrics.counter("escrag_reward_items", "items scored"),
            "truncations": metrics.counter("escrag_reward_truncations",
                                           "inputs whose history was truncated from the left"),
            "queue_full": metrics.counter("escrag_reward_queue_full", "requests refused with 503"),
            "batch": metrics.histogram("escrag_reward_batch_size", "scorer batch sizes", BATCH_BUCKETS),
        }

    def info(self) -> dict:
        return {**self._info, **self.stats}

    def _count(self, key: str, n: int = 1) -> None:
        self.stats[key] += n
        if self._prom and key in self._prom:
            self._prom[key].inc(n)

    def _on_batch(self, size: int) -> None:
        self.stats["batches"] += 1
        if self._prom:
            self._prom["batch"].observe(size)

    def _run_batch(self, items: list[tuple[list[dict], str]]) -> list[tuple[float, bool]]:
        scores, truncated = self.scorer(items)
        self._count("truncations", sum(truncated))
        return list(zip(scores, truncated))

    async def score(self, items: list[dict]) -> dict:
        """items: [{"history": [messages], "output": str}] -> rewards, rm_scores, format_rewards."""
        if len(items) > self.max_queue:
            raise UserError(f"items: {len(items)} items exceed this server's queue limit of "
                            f"{self.max_queue}; split the request")
        for it in items:
            self.check(list(it["history"]))
        outputs = [it["output"] for it in items]
        fmt = [format_reward(o) for o in outputs]
        jobs = [(list(it["history"]), self.view(o)) for it, o in zip(items, outputs)]
        try:
            results = await self.batcher.submit(jobs)
        except QueueFull:
            self._count("queue_full")
            raise
        self._count("items", len(items))
        rm = [float(s) for s, _ in results]
        return {"rewards": [r + f for r, f in zip(rm, fmt)], "rm_scores": rm, "format_rewards": fmt}

    async def get_reward(self, query: list[str], prompts: list[str]) -> dict:
        """OpenRLHF's remote-RM call; see ``reward_server.protocol`` for how queries are split."""
        items = [{"history": prompt_history(p), "output": query_output(q, p)} for q, p in zip(query, prompts)]
        out = await self.score(items)
        return {"rewards": out["rewards"], "scores": out["rewards"],
                "extra_logs": {"rm_scores": out["rm_scores"], "format_rewards": out["format_rewards"]}}
