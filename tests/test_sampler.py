"""``trainer.sampler.StateSampler``: a fresh sampler shuffles epoch e with ``derive_seed(seed, "states", e)``
(not the old ``seed * 100_003 + e``); a state dict saved before the scheme was recorded resumes the old
order exactly (computed here from the old formula, independently of the sampler); a scheme-2 state
resumes the new order; a state of another (n, batch, seed) or an unknown scheme is refused.
Run: .venv/bin/python -m pytest -q tests/test_sampler.py"""

import random

import pytest

from escrag.seeds import derive_seed
from trainer.sampler import StateSampler

pytestmark = pytest.mark.unit

N, BATCH, SEED = 7, 3, 5


def _order(epoch_seed, n: int = N, epochs: int = 6) -> list[int]:
    """The state indices of ``epochs`` epochs in a row, each shuffled by ``random.Random(epoch_seed(e))``."""
    out = []
    for e in range(epochs):
        perm = list(range(n))
        random.Random(epoch_seed(e)).shuffle(perm)
        out += perm
    return out


OLD = _order(lambda e: SEED * 100_003 + e)
NEW = _order(lambda e: derive_seed(SEED, "states", e))


def _draw(sampler: StateSampler, batches: int) -> list[int]:
    return [i for _ in range(batches) for i in sampler.next_batch()]


def test_fresh_sampler_seeds_each_epoch_with_derive_seed():
    sampler = StateSampler(N, BATCH, SEED)
    assert _draw(sampler, 9) == NEW[:27]  # crosses three epoch boundaries, one mid-batch
    assert NEW != OLD
    assert sampler.state_dict() == {"epoch": 3, "index": 6, "n": N, "batch": BATCH, "seed": SEED, "scheme": 2}


def test_old_state_without_scheme_resumes_the_old_order():
    old_state = {"epoch": 1, "index": 2, "n": N, "batch": BATCH, "seed": SEED}  # as checkpoints wrote it
    sampler = StateSampler(N, BATCH, SEED)
    sampler.load_state_dict(old_state)
    assert _draw(sampler, 5) == OLD[N + 2:N + 2 + 15]
    assert sampler.state_dict()["scheme"] == 1  # and it stays old across later checkpoints
    again = StateSampler(N, BATCH, SEED)
    again.load_state_dict(sampler.state_dict())
    assert _draw(again, 2) == OLD[N + 17:N + 23]


def test_new_state_resumes_the_new_order():
    first = StateSampler(N, BATCH, SEED)
    _draw(first, 4)
    resumed = StateSampler(N, BATCH, SEED)
    resumed.load_state_dict(first.state_dict())
    assert _draw(resumed, 5) == NEW[12:27] == _draw(first, 5)


@pytest.mark.parametrize("field", ["n", "batch", "seed"])
def test_mismatched_run_is_refused(field):
    sampler = StateSampler(N, BATCH, SEED)
    for state in (sampler.state_dict(), {k: v for k, v in sampler.state_dict().items() if k != "scheme"}):
        with pytest.raises(ValueError, match="does not match this run's"):
            StateSampler(N, BATCH, SEED).load_state_dict({**state, field: state[field] + 1})


def test_unknown_scheme_is_refused():
    with pytest.raises(ValueError, match="scheme 3"):
        StateSampler(N, BATCH, SEED).load_state_dict({**StateSampler(N, BATCH, SEED).state_dict(), "scheme": 3})
