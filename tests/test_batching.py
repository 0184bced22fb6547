"""MicroBatcher coalesces concurrent submissions into few batch calls, keeps order, bounds its
queue, and delivers a failure only to the request whose item caused it. Run: .venv/bin/python -m pytest -q tests/test_batching.py"""

import asyncio

import pytest

from escrag.config import RewardConfig
from escrag.web.batching import MicroBatcher, QueueFull

pytestmark = pytest.mark.unit


def test_concurrent_requests_are_coalesced_in_order():
    calls = []

    def square(items):
        calls.append(len(items))
        return [x * x for x in items]

    async def main():
        b = MicroBatcher(square, max_batch=16, max_wait_ms=600_000,  # batches close on count alone
                         max_queue=RewardConfig().max_queue)
        return await asyncio.gather(*(b.submit([i, i + 100]) for i in range(24)))

    results = asyncio.run(main())
    assert results == [[i * i, (i + 100) ** 2] for i in range(24)]
    assert calls == [16, 16, 16]


def test_queue_bound_and_errors():
    def boom(items):
        raise ValueError("bad batch")

    async def main():
        b = MicroBatcher(boom, max_batch=4, max_wait_ms=1, max_queue=3)
        with pytest.raises(QueueFull):
            await b.submit([1, 2, 3, 4])
        with pytest.raises(ValueError, match="bad batch"):
            await b.submit([1])
        assert b.pending == 0
        assert await b.submit([]) == []

    asyncio.run(main())


def test_one_bad_item_fails_only_its_own_request():
    """A batch whose call fails is run again item by item: the bad item's request gets the error, the
    other requests coalesced with it get their results (issue 25: one raw surrogate failed them all)."""
    calls = []

    def strict(items):
        calls.append(list(items))
        if "bad" in items:
            raise ValueError("cannot read 'bad'")
        return [x * 2 for x in items]

    async def main():
        b = MicroBatcher(strict, max_batch=8, max_wait_ms=600_000, max_queue=16)
        return await asyncio.gather(b.submit([1, 2]), b.submit(["bad"]), b.submit([3]), b.submit([4, 5, 6, 7]),
                                    return_exceptions=True)

    good1, bad, good2, good3 = asyncio.run(main())
    assert (good1, good2, good3) == ([2, 4], [6], [8, 10, 12, 14])
    assert isinstance(bad, ValueError) and "bad" in str(bad)
    assert calls[0] == [1, 2, "bad", 3, 4, 5, 6, 7] and len(calls) == 9  # the batch, then each item alone
