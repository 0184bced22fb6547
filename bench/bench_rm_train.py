"""Reward-model training cost: the cached-feature trainer vs a naive loop, side by side in one run.

Ours: ``reward_server.train.train_reward_model`` with an empty feature cache: every (history, reply)
runs through the frozen backbone once, then the head trains on the cache.
Naive: the same pairs, epochs, step size and loss, but each training step runs the frozen backbone on
its pairs, and each epoch's held-out evaluation runs it on the held-out pairs again: what a trainer
that ignores the frozen backbone would do. Both count backbone forward passes (sequences).

Run (the lead runs the full size alone on the machine):
    .venv/bin/python bench/bench_rm_train.py                    # SmolLM2-135M, 64 pairs, 5 epochs
    .venv/bin/python bench/bench_rm_train.py --pairs 8 --epochs 2 --backbone tiny-random:qwen2  # smoke
Writes bench/results/rm_train.json.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from escrag.atomic import write_json  # noqa: E402
from escrag.config import load_config  # noqa: E402
from escrag.pairs import bootstrap_pairs, write_pairs  # noqa: E402
from reward_server.train import pair_metrics, rm_loss, split_pairs, train_reward_model  # noqa: E402


def naive_train(cfg, pairs) -> dict:
    """Backbone forward on every pair in every epoch; same split, steps and loss as the trainer."""
    import torch

    from reward_server.model import Backbone

    rc = cfg.reward
    start = time.perf_counter()
    bb = Backbone(rc.backbone, rc.compute_dtype, rc.max_length, cfg.data.max_history_turns)
    train, held = split_pairs(pairs, rc.heldout_fraction, cfg.run.seed)

    def feats(ps):
        out = []
        for i in range(0, len(ps), rc.feature_batch_size):
            chunk = ps[i:i + rc.feature_batch_size]
            seqs = [bb.encode(p.history, t) for p in chunk for t in (p.chosen, p.rejected)]
            out.append(bb.features(seqs))
        x = torch.cat(out)
        return x[0::2], x[1::2]

    w = torch.zeros(bb.hidden_size, requires_grad=True)
    b = torch.zeros((), requires_grad=True)
    opt = torch.optim.AdamW([w, b], lr=rc.lr, weight_decay=0.0)
    step_pairs = rc.batch_size * rc.grad_accum
    gen = torch.Generator().manual_seed(cfg.run.seed)
    acc = float("nan")
    for _ in range(rc.epochs):
        order = torch.randperm(len(train), generator=gen).tolist()
        for s in range(0, len(order), step_pairs):
            x_pos, x_neg = feats([train[i] for i in order[s:s + step_pairs]])
            loss = rm_loss(x_pos @ w + b, x_neg @ w + b, rc.center_coef)
            opt.zero_grad()
            loss.backward()
            opt.step()
        acc = pair_metrics(w.detach(), b.item(), *feats(held), rc.center_coef)["accuracy"]
    return {"seconds": time.perf_counter() - start, "forward_passes": bb.forward_passes, "heldout_accuracy": acc}


def cached_train(cfg, pairs_path: Path, out: Path) -> dict:
    start = time.perf_counter()
    m = train_reward_model(cfg, pairs_path, out, log=lambda *_: None)
    return {"seconds": time.perf_counter() - start, "forward_passes": m["backbone_forward_passes"],
            "heldout_accuracy": m["heldout_accuracy"]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backbone", default="packaged:smollm2-135m-instruct")
    p.add_argument("--pairs", type=int, default=64, help="silver pairs from ESConv train")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--max-length", type=int, default=256)
    p.add_argument("--config", default=str(ROOT / "configs/cpu-demo.yaml"))
    p.add_argument("--out", default=str(ROOT / "bench/results/rm_train.json"))
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        cfg = load_config(args.config, [f"reward.backbone={args.backbone}", f"reward.epochs={args.epochs}",
                                        f"reward.max_length={args.max_length}", f"reward.feature_cache={tmp / 'f'}"])
        pairs = bootstrap_pairs("train", seed=0, max_pairs=args.pairs)
        path = write_pairs(pairs, tmp / "pairs.jsonl")
        from reward_server.model import Backbone

        Backbone(args.backbone, cfg.reward.compute_dtype, cfg.reward.max_length)  # warm-up: imports and the page cache, outside the timings
        ours = cached_train(cfg, path, tmp / "head")
        naive = naive_train(cfg, pairs)
    speedup = naive["seconds"] / ours["seconds"]
    rows = [("cached features (ours)", ours), ("naive: backbone every epoch", naive)]
    print(f"\nreward-model training: {args.backbone}, {args.pairs} pairs, {args.epochs} epochs, "
          f"max_length {args.max_length}")
    print(f"{'trainer':<30}{'wall s':>10}{'fwd passes':>12}{'held-out acc':>14}")
    for name, r in rows:
        print(f"{name:<30}{r['seconds']:>10.1f}{r['forward_passes']:>12}{r['heldout_accuracy']:>14.3f}")
    print(f"speed-up: {speedup:.1f}x wall time, "
          f"{naive['forward_passes'] / max(1, ours['forward_passes']):.1f}x fewer forward passes")
    result = {"backbone": args.backbone, "pairs": args.pairs, "epochs": args.epochs, "max_length": args.max_length,
              "ours": ours, "naive": naive, "speedup": speedup if math.isfinite(speedup) else None}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_json(args.out, result)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    from escrag.runtime import tune_process

    tune_process()
    sys.exit(main())
