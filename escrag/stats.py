"""``escrag data stats``: dialogues, states, mean turns and strategy distribution per split."""

from __future__ import annotations

import json

from escrag.data import SPLITS, split_stats


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
