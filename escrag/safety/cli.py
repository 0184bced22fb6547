"""``escrag safety eval`` and ``escrag safety fit-heads``."""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from escrag.errors import UserError
from escrag.safety import heads
from escrag.safety.backbone import Backbone, conv_dtype
from escrag.safety.cases import load_cases, resolve_cases
from escrag.safety.evaluation import (
    embedding_duplicates,
    evaluate,
    format_report,
    near_duplicates,
    score,
    shared_turn_sequences,
)
from escrag.safety.heads import conv_head_name, fit_conv_arrays, fit_head_arrays, head_key


def eval_main(args) -> int:
    """``escrag safety eval [--data FILE] [--json OUT] [--config FILE] [-o KEY=VALUE]``."""
    from escrag.atomic import write_json
    from escrag.config import load_config
    from escrag.safety.classifier import RiskClassifier

    cfg = load_config(args.config, args.override)
    cases = load_cases(args.data)
    clf = RiskClassifier.from_config(cfg)
    guard = _guard(cfg, getattr(args, "guard", None))
    result = evaluate(clf, cases) if guard is None else _with_guard(clf, guard, cases)
    sc, data = cfg.safety, resolve_cases(args.data).resolve()
    fitted = [resolve_cases(n) for n in [sc.tuning] + (list(sc.conv_tuning) if sc.backbone else [])]
    fitted = [p for p in dict.fromkeys(fitted) if p.resolve() != data]  # every file a head was fitted on
    if fitted:
        fit_on = [c for p in fitted for c in load_cases(p)]
        overlap = near_duplicates(cases, fit_on) + shared_turn_sequences(cases, fit_on)
        if clf.embedder is not None:
            overlap += embedding_duplicates(cases, fit_on, clf.embedder)
        result["separation"] = {"tuning": [str(p) for p in fitted], "overlapping_cases": len({a for a, _, _ in overlap}),
                                "pairs": overlap[:20]}
    result.update(data=str(data), config={k: getattr(sc, k) for k in (
        "head", "head_high", "embedder", "backbone", "conv_tuning", "conv_high", "conv_confirm", "conv_elevated")})
    print(format_report(result, str(resolve_cases(args.data))))
    if "embedded" in result:
        print("\nthe embedded check alone (same run):\n" + format_report(result["embedded"], str(data)))
    if args.json:
        write_json(args.json, result)
        print(f"\nwrote {args.json}")
    return 0


def _guard(cfg, guard: str | None):
    """The guard ``--guard`` names: None without the flag; ``safety.guard``, or a URL serving both protocols."""
    from escrag.safety.guard import Guard

    if guard is None:
        return None
    if guard != "config":
        gc = replace(cfg.safety.guard, chat_url=guard, moderation_url=guard,
                     chat_model=cfg.safety.guard.chat_model or "guard")
        cfg = replace(cfg, safety=replace(cfg.safety, guard=gc))
    found = Guard.from_config(cfg.safety)
    if found is None:
        raise UserError("--guard: safety.guard names no chat_url or moderation_url (give --guard URL or set them)")
    return found


def _with_guard(clf, guard, cases: list[dict]) -> dict:
    """The combined check's report, with the embedded check's of the same assessments under ``embedded``."""
    from escrag.safety.guard import combine

    t0 = time.perf_counter()
    histories = [c["messages"] for c in cases]
    embedded = clf.assess_many(histories)
    t1 = time.perf_counter()
    verdicts = guard.assess_all(histories)
    t2 = time.perf_counter()
    result = score(cases, [combine(e, g) for e, g in zip(embedded, verdicts)], t2 - t0)
    gc = guard.gc
    result.update(embedded=score(cases, embedded, t1 - t0), guard={
        "chat_url": gc.chat_url, "chat_kind": gc.chat_kind, "moderation_url": gc.moderation_url,
        "failures": dict(guard.failures), "ms_per_conversation": round(1000 * (t2 - t1) / max(len(cases), 1), 2)})
    return result


def fit_heads_main(args) -> int:
    """``escrag safety fit-heads [--config FILE]``: fit the config's two heads anew (no cache) and write
    them to data/safety/heads/, replacing the heads shipped before of the same kind (a conversation
    head read in the other ``safety.conv_dtype`` stays: run once per dtype to ship both)."""
    from escrag.atomic import atomic_file
    from escrag.config import load_config
    from escrag.embed import load_embedder

    sc = load_config(args.config, args.override).safety
    tuning = resolve_cases(sc.tuning)
    fitted = {f"safety-head-{head_key(sc, tuning)}": fit_head_arrays(sc, tuning, load_embedder(sc.embedder)),
             conv_head_name(sc, conv_dtype(sc)): fit_conv_arrays(sc, Backbone(sc.backbone, sc.conv_layers, sc.conv_batch,
                                                                              sc.conv_device, conv_dtype(sc)))}
    heads.HEADS_DIR.mkdir(parents=True, exist_ok=True)
    for name, arrays in fitted.items():
        with atomic_file(heads.HEADS_DIR / f"{name}.npz", "wb", encoding=None) as f:
            np.savez(f, **arrays)
        print(f"wrote {heads.HEADS_DIR / name}.npz")
    kinds = {n.rsplit("-", 1)[0] for n in fitted}  # safety-head, safety-conv, safety-conv-float32
    stale = {p for p in heads.HEADS_DIR.glob("*.npz") if p.stem.rsplit("-", 1)[0] in kinds}
    for old in stale - {heads.HEADS_DIR / f"{n}.npz" for n in fitted}:
        old.unlink()
        print(f"removed {old}")
    return 0
