"""Which train states each GRPO step draws.

Owns: ``total_steps`` (how many batches a run draws) and ``StateSampler``: seeded epoch permutations over the train states; its position is two ints,
saved in each checkpoint's ``state.json`` (``trainer.checkpoint``) so a resumed run continues at the
same data position.

Seeds. Epoch e is shuffled by ``random.Random(derive_seed(seed, "states", e))``, the project's one way
of naming a draw (``escrag.seeds``); ``state_dict`` records that as ``"scheme": 2``. Checkpoints
written before the scheme was recorded used ``seed * 100_003 + e`` (scheme 1): loading such a state
switches the sampler to it, so an old run resumes with exactly the data order it had.
"""

from __future__ import annotations

import math
import random

from escrag.seeds import derive_seed

SCHEME = 2  # what a fresh sampler uses; 1 is the formula of checkpoints without a "scheme" key
SCHEMES = (1, 2)


def total_steps(grpo, n_states: int) -> int:
    """Steps of a run: ``grpo.steps``, else ``grpo.epochs`` passes over ``n_states`` in batches of
    ``grpo.batch_states`` (the last one completed from the next epoch's permutation)."""
    return grpo.steps or math.ceil(grpo.epochs * n_states / grpo.batch_states)


class StateSampler:
    """Batches of state indices: epoch e visits a permutation seeded by (seed, e); a batch that
    crosses an epoch boundary continues into the next epoch."""

    def __init__(self, n: int, batch: int, seed: int = 0):
        if n < 1:
            raise ValueError("no training states")
        self.n, self.batch, self.seed = n, batch, seed
        self.epoch, self.index, self.scheme = 0, 0, SCHEME

    def _epoch_seed(self, epoch: int) -> int:
        if self.scheme == 1:
            return self.seed * 100_003 + epoch
        return derive_seed(self.seed, "states", epoch)

    def _perm(self, epoch: int) -> list[int]:
        order = list(range(self.n))
        random.Random(self._epoch_seed(epoch)).shuffle(order)
        return order

    def next_batch(self) -> list[int]:
        out = []
        while len(out) < self.batch:
            perm = self._perm(self.epoch)
            take = perm[self.index:self.index + self.batch - len(out)]
            out += take
            self.index += len(take)
            if self.index >= self.n:
                self.epoch, self.index = self.epoch + 1, 0
        return out

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "index": self.index, "n": self.n, "batch": self.batch, "seed": self.seed,
                "scheme": self.scheme}

    def load_state_dict(self, state: dict) -> None:
        """Continue at ``state``'s position, with its seeding scheme (1 when it names none)."""
        if (state["n"], state["batch"], state["seed"]) != (self.n, self.batch, self.seed):
            raise ValueError(f"checkpoint sampler (n, batch, seed) = {(state['n'], state['batch'], state['seed'])} "
                             f"does not match this run's {(self.n, self.batch, self.seed)}")
        scheme = state.get("scheme", 1)
        if scheme not in SCHEMES:
            raise ValueError(f"checkpoint sampler scheme {scheme!r} is not one this code knows {SCHEMES}")
        self.epoch, self.index, self.scheme = state["epoch"], state["index"], scheme
