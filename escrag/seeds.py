"""Stable seeds from names: ``derive_seed(run seed, "grpo", step, state id) -> int``.

Owns: the one way the project turns the parts that identify a draw into a seed, so a draw depends on
what it is (run, step, state, sample, stage), not on when or where it runs. Kept free of torch so
that code which only needs seeds (the evaluation, the counselor's request seeds) does not load it.
"""

from __future__ import annotations

import hashlib


def derive_seed(*parts) -> int:
    """A stable seed in [0, 2**32) from any printable parts."""
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest[:4], "little")
