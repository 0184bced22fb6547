"""The crisis data sets under data/safety/: their reader (``load_cases``), names (``resolve_cases``),
labels (``case_labels``) and the fit/dev split of the tuning cases (``dev_group``, ``fit_cases``)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from escrag.data import DataError, read_jsonl
from escrag.safety.types import CATEGORIES

SAFETY_DIR = Path(__file__).resolve().parents[2] / "data" / "safety"

# ------------------------------------------------------------------------------ data sets


def resolve_cases(name_or_path: str | Path) -> Path:
    """A bare name (``tuning``, ``tuning-round6``, ``eval``) is a bundled file under data/safety/;
    anything else is a path."""
    bundled = SAFETY_DIR / f"{name_or_path}.jsonl"
    if "/" not in str(name_or_path) and not str(name_or_path).endswith(".jsonl") and bundled.is_file():
        return bundled
    return Path(name_or_path)


def load_cases(name_or_path: str | Path) -> list[dict]:
    """Crisis cases (docs/safety.md: id, label, category, kind, messages), validated line by line."""
    path, cases, seen = resolve_cases(name_or_path), [], set()
    for where, _, obj in read_jsonl(path, "safety data file"):
        if not isinstance(obj, dict):
            raise DataError(f"{where}: expected an object")
        for key in ("id", "label", "category", "kind", "messages"):
            if key not in obj:
                raise DataError(f"{where}: missing '{key}'")
        if obj["label"] not in ("high", "not_high"):
            raise DataError(f"{where}: label must be 'high' or 'not_high', got {obj['label']!r}")
        if obj["category"] not in CATEGORIES + ("none",) or (obj["label"] == "high" and obj["category"] == "none"):
            raise DataError(f"{where}: category must be one of {', '.join(CATEGORIES)} (or 'none' when not_high), "
                            f"got {obj['category']!r}")
        msgs = obj["messages"]
        if (not isinstance(msgs, list) or not msgs or msgs[-1].get("role") != "user"
                or any(m.get("role") not in ("user", "assistant") or not isinstance(m.get("content"), str) for m in msgs)):
            raise DataError(f"{where}: messages must be user/assistant turns with text, ending with a user turn")
        if obj["id"] in seen:
            raise DataError(f"{where}: duplicate id {obj['id']!r}")
        seen.add(obj["id"])
        cases.append(obj)
    if not cases:
        raise DataError(f"{path}: no cases")
    return cases




def dev_group(case: dict) -> bool:
    """True for a case of round 6's dev half: its ``group`` (a case with its multi-turn and texting
    versions) hashes odd, so versions never straddle the split. Cases without a group are fit cases."""
    g = case.get("group")
    return g is not None and hashlib.sha256(g.encode()).digest()[0] % 2 == 1




def case_labels(cases: list[dict]) -> np.ndarray:
    """A case's class: 0 not high, 1 + the category's index in ``CATEGORIES`` when high."""
    return np.array([0 if k["label"] != "high" else 1 + CATEGORIES.index(k["category"]) for k in cases])



def fit_cases(sc) -> tuple[list[Path], list[dict]]:
    """The files of ``safety.conv_tuning`` and their cases less round 6's dev groups."""
    paths = [resolve_cases(name) for name in sc.conv_tuning]
    for p in paths:
        if not p.is_file():
            raise DataError(f"{p}: no such safety tuning file (safety.conv_tuning)")
    return paths, [c for p in paths for c in load_cases(p) if not dev_group(c)]
