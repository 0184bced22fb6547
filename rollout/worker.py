"""The rollout worker: one Ray actor per generation engine.

Owns: ``RolloutWorker``, an async Ray actor holding an engine (``rollout.engine`` in the config), a
retriever client and a reward client; ``generate_groups`` runs the two-stage episode for a list of
states on its engine (with the crisis check's ``risk_high`` / ``risk_elevated`` counts in each
group's stats unless ``safety.rollout_metric`` is off), ``load_weights`` swaps in new policy weights with a version. A batch of groups
and a weight load never overlap (one asyncio lock), so every group of a batch carries one version.

Ray restarts a dead worker (``max_restarts=-1``) with the weights it was built with (version 0); the
``RolloutPool`` brings it back to the latest version before it generates again. Tasks are not retried
by Ray (``max_task_retries=0``): the pool re-issues the states itself so nothing runs twice.
"""

from __future__ import annotations

import asyncio
import time

import ray

from escrag.config import Config
from escrag.data import DialogueState
from escrag.errors import UserError
from escrag.records import ScoredGroup
from escrag.seeds import derive_seed
from retriever_server.client import RetrieverClient
from reward_server.client import RewardClient


@ray.remote(num_cpus=1, max_restarts=-1, max_task_retries=0)
class RolloutWorker:
    def __init__(self, cfg: Config, retriever_url: str | None, reward_url: str, worker_index: int,
                 api_key: str | None = None):
        import torch

        from escrag.models import actor_env
        from rollout.engines import make_engine
        from rollout.episode import as_scheduler

        actor_env()
        if cfg.rollout.torch_threads:
            torch.set_num_threads(cfg.rollout.torch_threads)
        if cfg.rollout.rag and not retriever_url:
            raise UserError("rollout.rag is on but no retriever URL was given")
        self.cfg, self.index = cfg, worker_index
        self.engine = make_engine(cfg, seed=derive_seed(cfg.run.seed, "worker", worker_index))
        self.sched = as_scheduler(self.engine, cfg.rollout.max_batch)
        self.retriever = RetrieverClient(retriever_url, cfg.retriever, api_key) if cfg.rollout.rag else None
        self.reward = RewardClient(reward_url, cfg.reward, api_key)
        self.risk = None  # one crisis check per worker process: the risk metric of every rollout
        if cfg.safety.rollout_metric:
            from escrag.safety.classifier import RiskClassifier

            self.risk = RiskClassifier.from_config(cfg, run=self.engine.call)  # on the engine's thread
        self._lock = asyncio.Lock()
        self._in_flight, self._groups = 0, 0

    async def generate_groups(self, states: list[DialogueState], seeds: list[int]) -> list[ScoredGroup]:
        """One group per state; ``seeds`` gives each group its seed (``rollout.episode`` module doc)."""
        from rollout.episode import run_groups

        self._in_flight += 1
        try:
            async with self._lock:
                t0 = time.perf_counter()
                groups = await run_groups(states, self.sched, self.retriever, self.reward, self.cfg,
                                          self.engine.version, seeds, self.risk)
                batch_s = time.perf_counter() - t0
        finally:
            self._in_flight -= 1
        self._groups += len(groups)
        for g in groups:
            g.stats.update(worker=self.index, batch_s=batch_s)  # batch_s: this call's generation time
        return groups

    async def load_weights(self, weights_ref_or_dict, version: int) -> int:
        """Accepts the dict itself (Ray resolves a top-level ObjectRef argument) or a ref."""
        weights = weights_ref_or_dict
        if isinstance(weights, ray.ObjectRef):
            weights = await weights
        async with self._lock:
            await asyncio.to_thread(self.engine.load_weights, weights, version)
        return self.engine.version

    async def version(self) -> int:
        return self.engine.version

    async def stats(self) -> dict:
        """pid, weights version, batches in flight and groups made since this process started."""
        import os

        return {"pid": os.getpid(), "version": self.engine.version, "in_flight": self._in_flight,
                "groups": self._groups, "worker_index": self.index}

