"""Dynamic micro-batching for the HTTP services.

Owns: ``MicroBatcher``, which coalesces items submitted by concurrent requests into one call of a
batch function (embedding for the retriever, scoring for the reward server). A batch closes when it
holds ``max_batch`` items or ``max_wait_ms`` has passed since its first item; the batch function runs
in a worker thread so the event loop keeps accepting requests meanwhile. The queue is bounded:
``submit`` raises ``QueueFull`` beyond ``max_queue`` waiting items (servers answer 503 + Retry-After).
A batch whose call fails is run again item by item, so one bad item fails only its own request.
The three limits are the caller's (its config section: ``retriever.*`` or ``reward.*``); none has a default.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

from escrag.errors import Overloaded


class QueueFull(Overloaded):
    """More than ``max_queue`` items are waiting (servers answer 503 + Retry-After)."""


class MicroBatcher:
    def __init__(self, fn: Callable[[list[Any]], Sequence[Any]], max_batch: int, max_wait_ms: float,
                 max_queue: int, on_batch: Callable[[int], None] | None = None):
        self.fn, self.max_batch, self.max_wait = fn, max_batch, max_wait_ms / 1000.0
        self.max_queue, self.on_batch = max_queue, on_batch
        self._queue: asyncio.Queue | None = None
        self._task: asyncio.Task | None = None
        self.pending = 0  # items submitted and not yet answered

    def _ensure_started(self) -> None:
        if self._task is None or self._task.done():
            self._queue = asyncio.Queue()
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def submit(self, items: Sequence[Any]) -> list[Any]:
        """Queue ``items`` (one request's worth) and wait for their results, in order."""
        if not items:
            return []
        self._ensure_started()
        if self.pending + len(items) > self.max_queue:
            raise QueueFull(f"server overloaded: {self.pending} items waiting (limit {self.max_queue}); "
                            "retry shortly")
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in items]
        self.pending += len(items)
        for item, fut in zip(items, futures):
            self._queue.put_nowait((item, fut))
        try:
            return list(await asyncio.gather(*futures))
        finally:
            self.pending -= len(items)

    async def _collect(self) -> list[tuple[Any, asyncio.Future]]:
        batch = [await self._queue.get()]
        deadline = time.monotonic() + self.max_wait
        while len(batch) < self.max_batch:
            timeout = deadline - time.monotonic()
            if timeout <= 0:
                while len(batch) < self.max_batch and not self._queue.empty():
                    batch.append(self._queue.get_nowait())
                break
            try:
                batch.append(await asyncio.wait_for(self._queue.get(), timeout))
            except TimeoutError:
                break
        return batch

    async def _run(self) -> None:
        while True:
            batch = await self._collect()
            if not await self._deliver(batch):
                continue
            for one in batch:  # one bad item must not fail the others: each alone fails only its own future
                await self._deliver([one])

    async def _call(self, items: list[Any]) -> Sequence[Any]:
        results = await asyncio.to_thread(self.fn, items)
        if len(results) != len(items):
            raise RuntimeError(f"batch function returned {len(results)} results for {len(items)} items")
        return results

    async def _deliver(self, batch: list[tuple[Any, asyncio.Future]]) -> bool:
        """Run the function on ``batch`` and set its futures: True if it failed and was not delivered
        (a batch of several: to be retried item by item), else False."""
        try:
            results = await self._call([item for item, _ in batch])
        except Exception as exc:
            if len(batch) > 1:
                return True
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(exc)
            return False
        if self.on_batch:
            self.on_batch(len(batch))
        for (_, fut), res in zip(batch, results):
            if not fut.done():
                fut.set_result(res)
        return False
