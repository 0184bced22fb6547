"""Statistics: the one home of the project's intervals, and ``escrag data stats``.

Owns: ``bootstrap_ci`` (percentile bootstrap of a mean; a paired comparison passes the per-unit
differences), ``cluster_bootstrap_ci`` (the same with whole groups resampled), ``wilson`` (score interval of a share) and the ``escrag data stats`` command (dialogues,
states, mean turns and strategy distribution per split).
"""

from __future__ import annotations

import json
import math

from escrag.data import SPLITS, split_stats


def bootstrap_ci(values, resamples: int, ci: float, seed: int) -> tuple[float, float, float]:
    """(mean, low, high) of ``values`` [n]; an empty input gives NaNs, one value a zero-width interval."""
    import numpy as np

    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        return float("nan"), float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(resamples, x.size))].mean(axis=1)
    tail = (1.0 - ci) / 2 * 100
    lo, hi = np.percentile(means, [tail, 100 - tail])
    return float(x.mean()), float(lo), float(hi)


def cluster_bootstrap_ci(values, groups, resamples: int, ci: float, seed: int) -> tuple[float, float, float]:
    """(mean, low, high) of ``values`` with whole groups resampled (dialogues, topics): the interval
    when the units of one group are not independent. ``groups[i]`` names the group of ``values[i]``."""
    import numpy as np

    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        return float("nan"), float("nan"), float("nan")
    names = sorted(set(groups))
    index = {g: i for i, g in enumerate(names)}
    gid = np.array([index[g] for g in groups])
    sums, counts = np.bincount(gid, x, len(names)), np.bincount(gid, minlength=len(names))
    draws = np.random.default_rng(seed).integers(0, len(names), size=(resamples, len(names)))
    means = sums[draws].sum(1) / counts[draws].sum(1)
    tail = (1.0 - ci) / 2 * 100
    lo, hi = np.percentile(means, [tail, 100 - tail])
    return float(x.mean()), float(lo), float(hi)


def wilson(hits: int, n: int, ci: float) -> tuple[float, float, float]:
    """(share, low, high): the Wilson score interval of ``hits`` out of ``n`` (NaNs when n is 0)."""
    if n == 0:
        return float("nan"), float("nan"), float("nan")
    from statistics import NormalDist

    z = NormalDist().inv_cdf(0.5 + ci / 2)
    p = hits / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return p, max(0.0, centre - half), min(1.0, centre + half)


def main(args) -> int:
    splits = args.split or list(SPLITS)
    stats = {name: split_stats(name) for name in splits}
    if args.json:
        print(json.dumps(stats, indent=2))
        return 0
    for name, s in stats.items():
        print(f"{name}: {s['dialogues']} dialogues, {s['states']} states, "
              f"{s['mean_turns']:.1f} mean turns")
    strategies = sorted({k for s in stats.values() for k in s["strategies"]})
    width = max(len(k) for k in strategies) if strategies else 10
    print(f"\n{'strategy':<{width}}  " + "  ".join(f"{n[-12:]:>12}" for n in stats))
    for key in strategies:
        row = []
        for s in stats.values():
            total = sum(s["strategies"].values()) or 1
            row.append(f"{100 * s['strategies'].get(key, 0) / total:11.1f}%")
        print(f"{key:<{width}}  " + "  ".join(row))
    return 0
