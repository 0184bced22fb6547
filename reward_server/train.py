"""Reward-model training (paper eq. 3) on cached frozen-backbone features: ``escrag rm train``.

Owns: the pairwise loss ``rm_loss``, the held-out split, the head-fitting loop and
``train_reward_model(cfg, pairs_path, out)`` which the CLI, ``ray_jobs/train_rm.py`` and the demo call.

Flow: load and validate pairs -> encode (history, chosen) and (history, rejected) with the backbone's
chat template -> features of every input from the on-disk cache, computing only the missing ones ->
fit the linear head for ``epochs`` epochs -> report held-out pairwise accuracy and mean margin after
each epoch -> save ``head.safetensors`` + ``manifest.json`` + ``metrics.json`` in ``out``.

Loss per pair: ``-log σ(r+ − r−) + λ (r+ + r−)^2``, averaged, λ = ``reward.center_coef``.

Departures from the paper / implementation choices:
1. Gradient accumulation is exact: one optimizer step over ``batch_size × grad_accum`` pairs equals
   accumulating ``grad_accum`` micro-batch means (Table 4: 1 × 16), since the backbone is frozen and
   the micro-batches only exist to bound activation memory, which cached features do not need.
2. The head starts at zero (every pair ties) and trains on standardised features (z-scores with the
   training set's mean and std); the standardisation is folded back into the saved weight and bias,
   so the saved head is an ordinary linear map of the raw feature. It conditions the problem (a few
   hidden dimensions of a chat model are orders of magnitude larger than the rest).
3. The held-out split is by dialogue (``provenance.dialogue_id``, else the pair id), so no dialogue is
   on both sides. AdamW; ``reward.weight_decay`` decays the head's standardised weight, not its bias.
"""

from __future__ import annotations

import math
import random
import time
from pathlib import Path

from escrag.atomic import write_json
from escrag.config import load_config
from escrag.errors import UserError
from escrag.pairs import PreferencePair, load_pairs, refuse_split
from escrag.progress import progress_bar


def rm_loss(r_pos, r_neg, center_coef: float):
    """Eq. 3: mean over pairs of ``-log σ(r+ − r−) + λ (r+ + r−)^2``. r_pos, r_neg: [B] -> scalar."""
    import torch.nn.functional as F

    return (-F.logsigmoid(r_pos - r_neg) + center_coef * (r_pos + r_neg) ** 2).mean()


def split_pairs(pairs: list[PreferencePair], fraction: float, seed: int):
    """(train, heldout) by group; at least one group on each side."""
    groups = sorted({p.group for p in pairs})
    if len(groups) < 2:
        raise UserError(f"{len(pairs)} pairs from {len(groups)} dialogue(s): need pairs from at least two "
                        "dialogues to hold some out")
    random.Random(seed).shuffle(groups)
    n_held = min(len(groups) - 1, max(1, round(len(groups) * fraction)))
    held = set(groups[:n_held])
    return [p for p in pairs if p.group not in held], [p for p in pairs if p.group in held]


def pair_metrics(weight, bias, x_pos, x_neg, center_coef: float) -> dict:
    """Pairwise accuracy (r+ > r−), mean margin and loss of a head on feature tensors [n, H]."""
    import torch

    with torch.no_grad():
        r_pos, r_neg = x_pos @ weight + bias, x_neg @ weight + bias
        return {"accuracy": float((r_pos > r_neg).float().mean()), "margin": float((r_pos - r_neg).mean()),
                "loss": float(rm_loss(r_pos, r_neg, center_coef))}


def fit_head(train: tuple, held: tuple, rc, seed: int, log=print):
    """Train the linear head on standardised features; returns (weight [H], bias, per-epoch metrics).

    ``train`` and ``held`` are (x_pos, x_neg) float tensors [n, H] of raw features.
    """
    import torch

    x_pos, x_neg = train
    both = torch.cat([x_pos, x_neg])
    mean, std = both.mean(0), both.std(0).clamp_min(1e-6)
    z_pos, z_neg = (x_pos - mean) / std, (x_neg - mean) / std
    w = torch.zeros(both.shape[1], requires_grad=True)
    b = torch.zeros((), requires_grad=True)
    opt = torch.optim.AdamW([{"params": [w], "weight_decay": rc.weight_decay}, {"params": [b], "weight_decay": 0.0}],
                            lr=rc.lr)
    step_pairs = rc.batch_size * rc.grad_accum
    steps_per_epoch = math.ceil(len(x_pos) / step_pairs)
    gen = torch.Generator().manual_seed(seed)
    raw = lambda: (w.detach() / std, float(b.detach() - (w.detach() / std) @ mean))  # noqa: E731
    history = []
    with progress_bar(total=rc.epochs * steps_per_epoch, desc="reward head", unit="step") as bar:
        for epoch in range(1, rc.epochs + 1):
            order, losses = torch.randperm(len(x_pos), generator=gen), []
            for start in range(0, len(order), step_pairs):
                idx = order[start:start + step_pairs]
                loss = rm_loss(z_pos[idx] @ w + b, z_neg[idx] @ w + b, rc.center_coef)
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses.append(loss.item())
                bar.update(1)
            weight, bias = raw()
            m = pair_metrics(weight, bias, *held, rc.center_coef)
            row = {"epoch": epoch, "train_loss": sum(losses) / len(losses), "heldout_accuracy": m["accuracy"],
                   "heldout_margin": m["margin"], "heldout_loss": m["loss"]}
            history.append(row)
            bar.set_postfix(acc=f"{m['accuracy']:.3f}", margin=f"{m['margin']:.2f}")
            log(f"epoch {epoch}: train loss {row['train_loss']:.4f}  held-out accuracy "
                f"{m['accuracy']:.3f}  mean margin {m['margin']:.3f}")
    weight, bias = raw()
    return weight, bias, history


def _encode_pairs(backbone, pairs: list[PreferencePair]):
    encs = [backbone.encode(p.history, text) for p in pairs for text in (p.chosen, p.rejected)]
    return encs, sum(e.truncated for e in encs)


def _features(cfg, backbone, pairs):
    """Raw features (x_pos, x_neg) for pairs, through the cache; plus cache stats and truncations."""
    import torch

    from reward_server.features import FeatureCache, cached_features

    cache = FeatureCache(cfg.reward.feature_cache, backbone.feature_id, backbone.hidden_size)
    seqs, truncations = _encode_pairs(backbone, pairs)
    feats, stats = cached_features(backbone, seqs, cache, cfg.reward.feature_batch_size)
    x = torch.from_numpy(feats)
    return (x[0::2], x[1::2]), {**stats, "truncations": truncations, "cache_dir": str(cache.dir)}


def train_reward_model(cfg, pairs_path: str | Path, out: str | Path, log=print) -> dict:
    """Train the head on ``pairs_path`` with ``cfg.reward``; save it in ``out``; return the metrics."""
    from reward_server.model import Backbone, save_head

    rc, seed = cfg.reward, cfg.run.seed
    pairs = load_pairs(pairs_path)
    refuse_split(pairs, cfg.data.test, f"the reward-model trainer ({pairs_path})")
    if rc.max_pairs and len(pairs) > rc.max_pairs:
        pairs = random.Random(seed).sample(pairs, rc.max_pairs)
    train, held = split_pairs(pairs, rc.heldout_fraction, seed)
    log(f"{len(train)} training pairs, {len(held)} held-out pairs; backbone {rc.backbone} ({rc.compute_dtype})")
    backbone = Backbone(rc.backbone, rc.compute_dtype, rc.max_length, cfg.data.max_history_turns, rc.device,
                        rc.layer, rc.pooling)
    t0 = time.perf_counter()
    x_train, stats = _features(cfg, backbone, train)
    x_held, stats_h = _features(cfg, backbone, held)
    t1 = time.perf_counter()
    weight, bias, epochs = fit_head(x_train, x_held, rc, seed, log)
    t2 = time.perf_counter()
    final = pair_metrics(weight, bias, *x_train, rc.center_coef)
    manifest = {"backbone": rc.backbone, "backbone_fingerprint": backbone.fingerprint, "dtype": rc.compute_dtype,
                "max_length": rc.max_length, "max_history_turns": cfg.data.max_history_turns,
                "layer": rc.layer, "pooling": rc.pooling, "pairs": str(pairs_path), "center_coef": rc.center_coef,
                # the dialogues it saw (held-out pairs included): the evaluation's proxy RM avoids them
                "dialogue_ids": sorted({p.group for p in pairs})}
    metrics = {
        "pairs_file": str(pairs_path), "n_train": len(train), "n_heldout": len(held), "epochs": epochs,
        "heldout_accuracy": epochs[-1]["heldout_accuracy"], "heldout_margin": epochs[-1]["heldout_margin"],
        "train_loss_final": final["loss"], "train_accuracy_final": final["accuracy"],
        "features_computed": stats["computed"] + stats_h["computed"],
        "features_cached": stats["cached"] + stats_h["cached"],
        "backbone_forward_passes": backbone.forward_passes,
        "truncations": stats["truncations"] + stats_h["truncations"],
        "feature_seconds": t1 - t0, "train_seconds": t2 - t1, "feature_cache": stats["cache_dir"],
    }
    out = save_head(out, weight, bias, manifest)
    write_json(out / "metrics.json", metrics)
    return metrics


def main(args) -> int:
    """``escrag rm train --pairs FILE --out DIR [--backbone SPEC] [--config FILE] [-o k=v]``."""
    cfg = load_config(args.config, args.override)
    if args.backbone:
        cfg.reward.backbone = args.backbone
    m = train_reward_model(cfg, args.pairs, args.out)
    print(f"saved reward head to {args.out}: held-out pairwise accuracy {m['heldout_accuracy']:.3f}, mean "
          f"margin {m['heldout_margin']:.3f} ({m['n_heldout']} pairs); features computed "
          f"{m['features_computed']}, from cache {m['features_cached']}; truncated inputs {m['truncations']}")
    return 0
