"""Step 1 of experiments/strategy_claim (README.md): does retrieval carry the gold strategy, with no model?

Owns: the go / no-go table. On valid, each state's query (the client's last turn; the gold counselor
turn as an oracle draft, for context) retrieves the top-k exemplars of the full ESConv-train index;
the majority strategy of their labels (``vote``) is a hit when it is a gold label of the state. The
baseline is the best constant label on valid. The decision is the paired bootstrap over dialogues of
(retrieval hit - constant hit) at the primary setting, written in README.md before the run.

    python -m experiments.strategy_claim.gonogo [--config experiments/strategy_claim/config.yaml]
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

import numpy as np

from escrag.config import run_paths
from escrag.data import STRATEGIES, load_states
from escrag.errors import run_main
from escrag.stats import cluster_bootstrap_ci
from experiments.strategy_claim.config import load

HERE = Path(__file__).resolve().parent
PRIMARY = ("client_turn", 3)
RESAMPLES, SEED = 2000, 0


def vote(hits: list[dict]) -> str:
    """The majority label of ``hits`` (each label of each hit one vote; ties to the better-ranked hit)."""
    votes = Counter(label for h in hits for label in h["strategies"])
    if not votes:
        return ""
    top = max(votes.values())
    return next(label for h in hits for label in h["strategies"] if votes[label] == top)


def search(service, queries: list[str], k: int) -> list[list[dict]]:
    out = []
    for i in range(0, len(queries), 256):
        out += service.search_batch([(q, k, None) for q in queries[i:i + 256]])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(HERE / "config.yaml"))
    ap.add_argument("--out", default=str(HERE / "gonogo.json"))
    args = ap.parse_args()
    cfg = load(args.config)
    index_dir = run_paths(cfg).index
    from escrag.embed import load_embedder
    from retriever_server.build import build_index
    from retriever_server.index import load_index
    from retriever_server.service import RetrieverService

    if not (index_dir / "manifest.json").is_file():
        build_index(cfg, out=index_dir)
    index = load_index(index_dir, cfg.retriever.embedder, cfg.retriever)
    service = RetrieverService(index, load_embedder(cfg.retriever.embedder, cfg.retriever.device), cfg.retriever)
    states = load_states("valid")
    gold = [set(s.strategies) for s in states]
    groups = [s.dialogue_id for s in states]
    share = {label: float(np.mean([label in g for g in gold])) for label in STRATEGIES}
    constant = max(share, key=share.get)
    const_hit = np.array([constant in g for g in gold], dtype=float)
    queries = {"client_turn": [s.history[-1]["content"] for s in states],
               "gold_turn (oracle draft)": [s.target for s in states]}
    rows = []
    for name, qs in queries.items():
        hits = search(service, qs, 5)
        for k in (1, 3, 5):
            hit = np.array([vote(h[:k]) in g for h, g in zip(hits, gold)], dtype=float)
            rows.append({"query": name, "k": k, "hit_rate": float(hit.mean()),
                         "minus_constant": list(cluster_bootstrap_ci(hit - const_hit, groups, RESAMPLES, 0.95, SEED)),
                         "primary": (name, k) == PRIMARY})
            print(f"{name:26s} k={k}  hit {hit.mean():.3f}  minus constant {rows[-1]['minus_constant'][0]:+.3f} "
                  f"[{rows[-1]['minus_constant'][1]:+.3f}, {rows[-1]['minus_constant'][2]:+.3f}]", flush=True)
    primary = next(r for r in rows if r["primary"])
    go = primary["minus_constant"][1] > 0
    result = {"split": "valid", "states": len(states), "dialogues": len(set(groups)), "index_chunks": index.count,
              "embedder": cfg.retriever.embedder, "constant_label": constant, "constant_hit_rate": share[constant],
              "label_shares": share, "rows": rows, "primary": {"query": PRIMARY[0], "k": PRIMARY[1]},
              "decision": "GO" if go else "NO-GO", "bootstrap": {"resamples": RESAMPLES, "over": "dialogues"}}
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"best constant label {constant!r}: {share[constant]:.3f}; decision: {result['decision']} -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main("strategy_claim.gonogo", main))
