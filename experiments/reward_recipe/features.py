"""Frozen-backbone features for the reward-recipe search (issue 53, item 2), computed once and cached.

    .venv/bin/python -m experiments.reward_recipe.features [--train-states 300] [--valid-generic-states 60] [--no-lock]

Owns: the items the search fits and chooses on, and their features at several layers and two poolings,
in ``runs/reward_recipe/feats/`` (not committed). Items:
- train: ``bootstrap_pairs`` states from ESConv train, each with its gold turn and one negative of every
  kind of ``escrag.pairs.NEGATIVE_KINDS`` (so any negative mix is a choice of rows, not a new pass);
- valid: the states of ``escrag eval labels`` on ESConv valid (one per dialogue, all 195 dialogues),
  each with its gold turn and the other dialogue's turn;
- validgen: every reply of ``generic_eval.txt`` after the history of the first ``--valid-generic-states``
  valid states.
Test is never read here (``score_test.py`` scores it once, through the real reward model).

A feature is the backbone's final norm applied to layer L's output (``reward.layer``; L = 30, the last,
is today's feature), read at the last token (``last_token``) or averaged over the reply's tokens
(``reply_mean``): exactly what ``reward_server.model.Backbone`` computes for that layer and pooling
(``run.sh`` checks a few rows). Every input runs alone, as the reward server runs it on a CPU.

Chunks of ``CHUNK`` inputs, each under ``flock /tmp/escrag-heavy.lock`` (the machine is shared) and
written atomically, so an interrupted run resumes at the next missing chunk.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
from pathlib import Path

import numpy as np

ROOT = Path("runs/reward_recipe")
HERE = Path(__file__).resolve().parent
LAYERS = (6, 9, 12, 15, 18, 21, 24, 27, 30)
POOLINGS = ("last_token", "reply_mean")
CHUNK = 60
LOCK = "/tmp/escrag-heavy.lock"
CONFIG = "configs/cpu-demo.yaml"  # the embedded default's max_length and max_history_turns


def generic_eval() -> list[str]:
    lines = (HERE / "generic_eval.txt").read_text().splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")]


def train_items(n_states: int, seed: int) -> list[dict]:
    from escrag.pairs import NEGATIVE_KINDS, bootstrap_pairs

    k = len(NEGATIVE_KINDS)
    pairs = bootstrap_pairs("train", seed, n_states * k, negatives=NEGATIVE_KINDS, per_state=k)
    items, seen = [], set()
    for p in pairs:
        sid = f"{p.provenance['dialogue_id']}/{p.provenance['turn_index']}"
        if sid not in seen:
            seen.add(sid)
            items.append({"state": sid, "dialogue_id": p.group, "kind": "gold", "history": p.history,
                          "reply": p.chosen})
        items.append({"state": sid, "dialogue_id": p.group, "kind": p.provenance["negative"],
                      "history": p.history, "reply": p.rejected})
    return items


def valid_items(seed: int) -> list[dict]:
    from evaluation.labels import label_items

    states = label_items("valid", 1, seed, surveyed=False)
    return [{"state": str(i), "dialogue_id": s["dialogue_id"], "kind": kind, "history": s["history"], "reply": reply}
            for i, s in enumerate(states) for kind, reply in (("gold", s["gold"]), ("other", s["other"]))]


def generic_items(valid: list[dict], n_states: int) -> list[dict]:
    """Every reply of ``generic_eval.txt`` after the history of each of the first ``n_states`` valid states."""
    gold = [i for i in valid if i["kind"] == "gold"][:n_states]
    return [{**i, "kind": "generic_eval", "reply": g} for i in gold for g in generic_eval()]


class LayerReader:
    """The backbone with hooks on the decoder layers of ``LAYERS``; a row's feature is float32
    [len(LAYERS), len(POOLINGS), H] (final norm applied to each layer's output, then pooled)."""

    def __init__(self, backbone):
        import torch

        self.backbone, self.torch, self.out = backbone, torch, {}
        for layer in LAYERS:
            backbone.model.layers[layer - 1].register_forward_hook(self._hook(layer))

    def _hook(self, layer):
        def hook(_module, _args, output):
            self.out[layer] = output[0] if isinstance(output, tuple) else output
        return hook

    def _pool(self) -> np.ndarray:
        rows = []
        for layer in LAYERS:
            h = self.backbone.model.norm(self.out[layer][0]).float()
            rows.append(self.torch.stack([h[-1], h.mean(0)]))
        return self.torch.stack(rows).numpy()

    def read(self, prefix: list[int], replies: list[list[int]]) -> list[np.ndarray]:
        """Features of ``prefix + reply`` for each reply (the reply's own tokens are what is pooled): the
        prefix runs once, its K/V are reused (equal to a whole pass up to float32 rounding)."""
        from transformers import DynamicCache

        torch, model = self.torch, self.backbone.model
        with torch.inference_mode():
            cache = DynamicCache(config=model.config)
            model(input_ids=torch.tensor([prefix]), past_key_values=cache, use_cache=True)
            out = []
            for reply in replies:
                model(input_ids=torch.tensor([reply]), past_key_values=cache, use_cache=True)
                out.append(self._pool())
                cache.crop(-len(reply))
        return out


def read_items(reader, items: list[dict]) -> np.ndarray:
    """[n, len(LAYERS), len(POOLINGS), H] for items; consecutive inputs with the same history tokens share a prefix pass."""
    encs = [reader.backbone.encode(i["history"], i["reply"]) for i in items]
    feats, k = [], 0
    while k < len(encs):
        prefix = encs[k].ids[:-encs[k].reply_len]
        j = k
        while j < len(encs) and encs[j].ids[:-encs[j].reply_len] == prefix:
            j += 1
        feats += reader.read(prefix, [e.ids[-e.reply_len:] for e in encs[k:j]])
        k = j
    return np.stack(feats)


def extract(name: str, items: list[dict], reader, use_lock: bool = True, log=print) -> None:
    from escrag.atomic import atomic_file

    folder = ROOT / "feats"
    folder.mkdir(parents=True, exist_ok=True)
    for c in range(0, len(items), CHUNK):
        path = folder / f"{name}-{c // CHUNK:03d}.npz"
        if path.is_file():
            continue
        with open(LOCK, "w") as lock:
            if use_lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
            feats = read_items(reader, items[c:c + CHUNK])
            with atomic_file(path, "wb") as fh:
                np.savez(fh, feats=feats)
        log(f"{name}: {min(c + CHUNK, len(items))}/{len(items)}")


def load(name: str) -> tuple[list[dict], np.ndarray]:
    """The items of ``name`` and their features [n, len(LAYERS), len(POOLINGS), H]."""
    items = [json.loads(ln) for ln in (ROOT / f"{name}-items.jsonl").read_text().splitlines()]
    chunks = sorted((ROOT / "feats").glob(f"{name}-*.npz"))
    feats = np.concatenate([np.load(p)["feats"] for p in chunks])
    if len(feats) != len(items):
        raise SystemExit(f"{name}: {len(feats)} of {len(items)} features; run experiments.reward_recipe.features")
    return items, feats


def main() -> None:
    import torch

    from escrag.config import load_config
    from escrag.runtime import tune_process
    from reward_server.model import Backbone

    p = argparse.ArgumentParser()
    p.add_argument("--train-states", type=int, default=300)
    p.add_argument("--valid-generic-states", type=int, default=60)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-lock", action="store_true", help="run at nice 19 instead of under the heavy lock (while "
                   "another holds it for long: this takes only the cycles others leave)")
    args = p.parse_args()
    tune_process()
    torch.set_num_threads(2)
    if args.no_lock:  # one thread: a niced process's second thread mostly waits for the first to be scheduled
        os.nice(19)
        torch.set_num_threads(1)
    cfg = load_config(CONFIG)
    backbone = Backbone(cfg.reward.backbone, "float32", cfg.reward.max_length, cfg.data.max_history_turns, "cpu")
    reader = LayerReader(backbone)
    ROOT.mkdir(parents=True, exist_ok=True)
    valid = valid_items(args.seed)
    for name, items in (("valid", valid), ("train", train_items(args.train_states, args.seed)),
                        ("validgen", generic_items(valid, args.valid_generic_states))):
        path = ROOT / f"{name}-items.jsonl"
        text = "".join(json.dumps(i) + "\n" for i in items)
        if path.is_file() and path.read_text() != text:
            raise SystemExit(f"{path} holds other items: remove {ROOT} to start over")
        path.write_text(text)
        extract(name, items, reader, not args.no_lock)


if __name__ == "__main__":
    main()
