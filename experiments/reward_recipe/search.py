"""The reward-recipe search (issue 53, item 2): linear heads on cached frozen-backbone features, chosen on
ESConv valid.

    .venv/bin/python -m experiments.reward_recipe.search      (after experiments.reward_recipe.features)
    .venv/bin/python -m experiments.reward_recipe.search --tables   (README's tables from search-valid.json)

Owns: fitting one head per recipe on the train items' features (``reward_server.train.fit_head``, the
trainer's own loop and loss, eq. 3) and scoring it on valid: ``other_dialogue`` (the share of states
whose gold turn outscores another dialogue's turn after the same history, ties half: what
``escrag eval labels`` reports) and ``generic`` (the share of (state, reply) pairs where a reply of
``generic_eval.txt`` outscores the gold turn). Intervals: 95% bootstrap over valid dialogues.

A recipe: the layer read, the pooling, the silver negative kinds (each train state's gold turn against
one negative of each kind in the mix), λ (``center_coef``) and the head's weight decay. The rule, fixed
before the search ran: among recipes whose valid generic share is under 0.20, the highest valid
other-dialogue AUC; within 0.005 of it, the lowest layer (the cheapest backbone pass). Then a learning
curve of the chosen recipe over the number of train states sizes the demo's pairs. Test is not read.
Writes ``search-valid.json`` beside this file.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from experiments.reward_recipe.features import LAYERS, POOLINGS, load

HERE = Path(__file__).resolve().parent
MIXES = {  # name -> negative kinds (escrag.pairs.NEGATIVE_KINDS)
    "today": ("other_dialogue", "generic", "lecturing", "truncated"),
    "all": ("other_dialogue", "same_problem", "same_dialogue", "generic", "lecturing", "truncated"),
    "relevance": ("other_dialogue", "same_problem", "same_dialogue"),
    "relevance+generic": ("other_dialogue", "same_problem", "generic"),
    "other+generic": ("other_dialogue", "generic"),
}
CENTER = (0.01, 0.1)
DECAY = (0.0, 0.3, 3.0)
HEAD = {"lr": 5e-3, "epochs": 5, "batch_size": 16, "grad_accum": 1}  # configs/cpu-demo.yaml's
BOOT = (1000, 0.95, 0)


def train_pairs(items, feats, mix, states=None):
    """(x_pos, x_neg) float tensors [n, L, P, H]: each state's gold against its negatives of ``mix``."""
    import torch

    gold = {i["state"]: k for k, i in enumerate(items) if i["kind"] == "gold"}
    keep = None if states is None else set(np.random.default_rng(0).permutation(list(gold))[:states])
    pos, neg = [], []
    for k, i in enumerate(items):
        if i["kind"] in mix and (keep is None or i["state"] in keep):
            pos.append(gold[i["state"]])
            neg.append(k)
    return torch.from_numpy(feats[pos]), torch.from_numpy(feats[neg])


def valid_scores(valid, vfeats, gen, gfeats, w, b, li, pi):
    """(per-state gold-beats-other win [n], per-state generic share [m], dialogue ids of each)."""
    score = lambda f: f[:, li, pi] @ w + b  # noqa: E731
    sv, sg = score(vfeats), score(gfeats)
    gold = {i["state"]: sv[k] for k, i in enumerate(valid) if i["kind"] == "gold"}
    other = {i["state"]: sv[k] for k, i in enumerate(valid) if i["kind"] == "other"}
    win = np.array([(gold[s] > other[s]) + 0.5 * (gold[s] == other[s]) for s in gold])
    by_state: dict[str, list[float]] = {}
    for k, i in enumerate(gen):
        by_state.setdefault(i["state"], []).append((sg[k] > gold[i["state"]]) + 0.5 * (sg[k] == gold[i["state"]]))
    return win, np.array([np.mean(v) for v in by_state.values()])


def fit(xp, xn, li, pi, center, decay, seed=0):
    """The trainer's head fit on one layer and pooling of the features; (weight [H], bias)."""
    from reward_server.train import fit_head

    rc = SimpleNamespace(center_coef=center, weight_decay=decay, **HEAD)
    tr = (xp[:, li, pi].contiguous(), xn[:, li, pi].contiguous())
    with contextlib.redirect_stderr(io.StringIO()):  # its progress lines, hundreds of fits
        w, b, _ = fit_head(tr, tr, rc, seed, log=lambda *_: None)
    return w.numpy().astype(np.float64), float(b)


def evaluate(data, mix, li, pi, center, decay, states=None):
    from escrag.stats import bootstrap_ci

    (items, feats), (valid, vfeats), (gen, gfeats) = data
    xp, xn = train_pairs(items, feats, MIXES[mix], states)
    w, b = fit(xp, xn, li, pi, center, decay)
    win, share = valid_scores(valid, vfeats.astype(np.float64), gen, gfeats.astype(np.float64), w, b, li, pi)
    return {"layer": LAYERS[li], "pooling": POOLINGS[pi], "mix": mix, "center_coef": center,
            "weight_decay": decay, "train_pairs": len(xp), "valid_other_dialogue": bootstrap_ci(win, *BOOT),
            "valid_generic_share": bootstrap_ci(share, *BOOT)}


def choose(rows):
    ok = [r for r in rows if r["valid_generic_share"][0] < 0.20] or rows
    best = max(r["valid_other_dialogue"][0] for r in ok)
    near = [r for r in ok if r["valid_other_dialogue"][0] >= best - 0.005]
    return min(near, key=lambda r: (r["layer"], -r["valid_other_dialogue"][0]))


def _row(r) -> str:
    o, g = r["valid_other_dialogue"], r["valid_generic_share"]
    return (f"| {r['layer']} | {r['pooling']} | {r['mix']} | {r['center_coef']} | {r['weight_decay']} | {r['train_pairs']} "
            f"| {o[0]:.3f} [{o[1]:.3f}, {o[2]:.3f}] | {g[0]:.3f} [{g[1]:.3f}, {g[2]:.3f}] |")


def tables(out: dict) -> str:
    """README tables from ``search-valid.json``: the best recipe of each layer and pooling, every mix at the
    chosen layer and pooling, and the learning curve of the chosen recipe."""
    head = ("| layer | pooling | negatives | λ | weight decay | train pairs | valid other-dialogue AUC | "
            "valid generic share |\n|---|---|---|---|---|---|---|---|")
    rows, c = out["recipes"], out["chosen"]
    best = {}
    for r in rows:
        key = (r["layer"], r["pooling"])
        if key not in best or r["valid_other_dialogue"][0] > best[key]["valid_other_dialogue"][0]:
            best[key] = r
    mixes = [max((r for r in rows if (r["layer"], r["pooling"], r["mix"]) == (c["layer"], c["pooling"], m)),
                 key=lambda r: r["valid_other_dialogue"][0]) for m in out["mixes"]]
    return "\n\n".join([
        "Best of each layer and pooling:\n\n" + head + "\n" + "\n".join(_row(best[k]) for k in sorted(best)),
        f"Each negative mix at layer {c['layer']}, {c['pooling']}:\n\n" + head + "\n" + "\n".join(map(_row, mixes)),
        "Chosen recipe by train states:\n\n" + head + "\n" + "\n".join(map(_row, out["learning_curve"]))])


def main() -> None:
    import sys

    import torch

    if sys.argv[1:] == ["--tables"]:
        print(tables(json.loads((HERE / "search-valid.json").read_text())))
        return

    torch.set_num_threads(1)  # hundreds of small fits: a second thread only waits (the machine is shared)
    t0 = time.perf_counter()
    data = (load("train"), load("valid"), load("validgen"))
    rows = []
    for (li, pi), mix, center, decay in itertools.product(
            itertools.product(range(len(LAYERS)), range(len(POOLINGS))), MIXES, CENTER, DECAY):
        rows.append(evaluate(data, mix, li, pi, center, decay))
    chosen = choose(rows)
    li, pi = LAYERS.index(chosen["layer"]), POOLINGS.index(chosen["pooling"])
    n_states = len({i["state"] for i in data[0][0]})
    curve = [evaluate(data, chosen["mix"], li, pi, chosen["center_coef"], chosen["weight_decay"], n)
             for n in (n_states // 4, n_states // 2, n_states)]
    out = {"rule": "valid generic share < 0.20, then the highest valid other-dialogue AUC; within 0.005 the "
                   "lowest layer", "train_states": n_states,
           "valid_states": len([i for i in data[1][0] if i["kind"] == "gold"]),
           "valid_generic_states": len({i["state"] for i in data[2][0]}), "head": HEAD, "mixes": MIXES,
           "recipes": rows, "chosen": chosen, "learning_curve": curve, "seconds": time.perf_counter() - t0}
    (HERE / "search-valid.json").write_text(json.dumps(out, indent=1) + "\n")
    for r in sorted(rows, key=lambda r: -r["valid_other_dialogue"][0])[:15] + [chosen]:
        print(f"L{r['layer']:>2} {r['pooling']:<10} {r['mix']:<18} λ {r['center_coef']:<4} wd {r['weight_decay']:<3} "
              f"other {r['valid_other_dialogue'][0]:.3f}  generic {r['valid_generic_share'][0]:.3f}")


if __name__ == "__main__":
    main()
