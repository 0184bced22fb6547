"""The driver-side pool of rollout workers.

Owns: ``RolloutPool``: starts ``rollout.num_workers`` ``RolloutWorker`` actors, spreads a batch of
dialogue states across them (one contiguous chunk per worker, so each worker batches its groups),
gathers the groups in input order, and keeps every worker on the latest weights. ``submit`` starts a
batch and returns at once, ``collect`` waits for it, so a caller may keep several batches in flight
(the streaming learner generates the next steps while it updates); a worker runs its calls one at a
time, in the order they were submitted, each with the weights it holds when the call starts.

Fault handling: when a worker dies mid-batch, Ray restarts it and its call fails with
``RayActorError``; the pool re-issues that worker's whole chunk (the dead call returned nothing, so no
group is lost or counted twice), after bringing the restarted worker back to the latest weights
version. A chunk is re-issued at most ``rollout.max_reissues`` times. Other errors (a reward server
that is down, bad data) are not retried here and reach the caller.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass

import ray
from ray.exceptions import RayActorError

from escrag.config import Config
from escrag.data import DialogueState
from escrag.records import ScoredGroup
from rollout.worker import RolloutWorker

log = logging.getLogger(__name__)


class RolloutPool:
    def __init__(self, cfg: Config, retriever_url: str | None, reward_url: str):
        ro = cfg.rollout
        gpus = ro.worker_gpus if ro.worker_gpus is not None else (1.0 if ro.engine == "vllm" else 0.0)
        opts = {"num_cpus": ro.worker_cpus, "num_gpus": gpus}
        self.cfg = cfg
        # Ray workers do not inherit this process's environment: the servers' bearer token travels along
        key = os.environ.get("ESCRAG_API_KEY")
        self.workers = [RolloutWorker.options(**opts).remote(cfg, retriever_url, reward_url, i, key)
                        for i in range(ro.num_workers)]
        self._weights_ref = None
        self.version = 0  # latest weights version pushed
        self.reissued = 0  # chunks re-issued after a worker died (for logs and tests)

    def generate(self, states: list[DialogueState], seeds: list[int]) -> list[ScoredGroup]:
        """One ``ScoredGroup`` per state, in the order of ``states``; ``seeds[i]`` is state i's group
        seed, so what a state draws does not depend on which worker runs it."""
        return self.collect(self.submit(states, seeds))[0]

    def submit(self, states: list[DialogueState], seeds: list[int]) -> Batch:
        """Start generating a batch (as ``generate``) and return at once."""
        chunks = _split(list(zip(states, seeds)), len(self.workers)) if states else []
        return Batch(chunks, {self._submit(i, chunk): (i, 0) for i, chunk in enumerate(chunks)})

    def collect(self, batch: Batch) -> tuple[list[ScoredGroup], list]:
        """Wait for a submitted batch, re-issuing the chunks of workers that died. Returns (the groups
        in input order, the ObjectRef of each chunk's result, for a consumer that reads them from the
        object store)."""
        results: list[list[ScoredGroup] | None] = [None] * len(batch.chunks)
        refs: list = [None] * len(batch.chunks)
        pending = batch.calls
        while pending:
            (ref,), _ = ray.wait(list(pending), num_returns=1)
            i, attempts = pending.pop(ref)
            try:
                results[i], refs[i] = ray.get(ref), ref
            except RayActorError as exc:
                if attempts >= self.cfg.rollout.max_reissues:
                    raise RuntimeError(f"rollout worker {i} died {attempts + 1} times on one chunk; "
                                       f"giving up ({exc})") from exc
                log.warning("rollout worker %d died mid-batch; re-issuing its %d states", i,
                            len(batch.chunks[i]))
                self.reissued += 1
                pending[self._submit(i, batch.chunks[i])] = (i, attempts + 1)
        return [g for chunk in results for g in chunk], refs

    def _submit(self, i: int, chunk: list[tuple[DialogueState, int]]):
        self._catch_up(self.workers[i])
        return self.workers[i].generate_groups.remote([s for s, _ in chunk], [seed for _, seed in chunk])

    def _catch_up(self, worker) -> None:
        """Wait until a (possibly restarting) worker answers, then give it the latest weights."""
        ro = self.cfg.rollout
        deadline, delay = time.monotonic() + ro.restart_timeout_s, ro.restart_poll_s
        while True:
            try:
                if ray.get(worker.version.remote()) < self.version and self._weights_ref is not None:
                    ray.get(worker.load_weights.remote(self._weights_ref, self.version))
                return
            except RayActorError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(delay)  # Ray is restarting it: __init__ loads the model again
                delay = min(2 * delay, 20 * ro.restart_poll_s)

    def push_weights(self, weights, version: int) -> None:
        """Load ``weights`` (a dict, put in the object store once here, or the ObjectRef of one) into
        every worker, waiting until each has them (a worker busy generating loads them after its
        calls already queued there). A worker that is dead right now gets them when it next generates."""
        if version <= self.version:
            from rollout.engines.base import StaleWeightsError

            raise StaleWeightsError(f"weights version {version} is not newer than {self.version}")
        ref = weights if isinstance(weights, ray.ObjectRef) else ray.put(weights)
        self._weights_ref, self.version = ref, version
        calls = [w.load_weights.remote(ref, version) for w in self.workers]
        for call in calls:
            try:
                ray.get(call)
            except RayActorError:
                log.warning("a rollout worker died while loading weights; it catches up later")

    def versions(self) -> list[int]:
        return ray.get([w.version.remote() for w in self.workers])

    def shutdown(self) -> None:
        for w in self.workers:
            ray.kill(w, no_restart=True)
        self.workers = []


@dataclass
class Batch:
    """A submitted batch: its chunks of (state, seed) and the calls in flight (ref -> (chunk, tries))."""

    chunks: list[list[tuple[DialogueState, int]]]
    calls: dict


def _split(items: list, n: int) -> list[list]:
    """At most ``n`` contiguous non-empty chunks whose sizes differ by at most one."""
    n = max(1, min(n, len(items)))
    size, extra = divmod(len(items), n)
    chunks, start = [], 0
    for i in range(n):
        end = start + size + (i < extra)
        chunks.append(items[start:end])
        start = end
    return chunks
