"""Issue 15's design study: which crisis-check design generalises, judged without the evaluation set.

Run (from the repository root, after ``make install``; ~6 min alone on 2 cores):
    .venv/bin/python experiments/safety_designs/study.py [--threads 2]
Writes experiments/safety_designs/study.json and prints the table.

Data. Fit = data/safety/tuning.jsonl + the even half of data/safety/tuning-round6.jsonl's groups; dev =
the odd half (a group is a case with its multi-turn / texting versions, so versions never straddle
the split; ``dev_group``). Round 6 was written from docs/safety.md's categories and is used by no
shipped fitting, so the dev half is as unseen by the shipped detector as the evaluation set:
data/safety/eval.jsonl is never opened here (tests/experiments/test_safety_designs.py checks this file names it nowhere).

Designs. The detector before this study (layers 1-4 of escrag/safety/: rules, then rules + the
MiniLM sentence head fitted on tuning.jsonl only), a regression over the all-MiniLM-L6-v2 embedding of
the joined client turns, the conversation head alone (escrag/safety/heads.py: SmolLM2-135M-Instruct
hidden states at layers 8, 16, 24 averaged over the rendered conversation and a risk question) as one
six-class regression (held-out run 3's) and as shipped (high vs not high, then the category), the
detector as shipped (layers 1-5, ``RiskClassifier``), the shipped head over every client-turn
prefix, and non-linear heads (MLP, RBF SVM, nearest neighbours) over its features. P(high) = 1 -
P(not high); recall per category and the fraction of not-high cases flagged high at fixed
thresholds (for a detector's level: 0.5 = elevated or high, above = high). Then a learning curve: the
shipped head fitted on random fractions of the fit cases, dev AUC.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from escrag.atomic import write_json  # noqa: E402
from escrag.config import SafetyConfig  # noqa: E402
from escrag.safety.cases import case_labels, dev_group, fit_cases, load_cases  # noqa: E402
from escrag.safety.classifier import RiskClassifier, with_conversation  # noqa: E402
from escrag.safety.types import CATEGORIES  # noqa: E402

OUT = Path(__file__).resolve().parent / "study.json"
THRESHOLDS = (0.5, 0.7, 0.85, 0.9, 0.95)
LEVEL = {"none": 0.0, "elevated": 0.5, "high": 1.0}


def levels(clf: RiskClassifier, cases: list[dict]) -> np.ndarray:
    return np.array([LEVEL[a.level] for a in clf.assess_many([c["messages"] for c in cases])])


def minilm_p_high(fit: list[dict], dev: list[dict], c: float) -> np.ndarray:
    """A regression over the MiniLM embedding of the joined client turns, fitted like the conversation head."""
    from escrag.embed import load_embedder
    from escrag.safety.heads import fit_conversation_head

    emb = load_embedder("packaged:minilm")

    def enc(cases: list[dict]) -> np.ndarray:
        return emb.encode([" ".join(m["content"] for m in k["messages"] if m["role"] == "user") for k in cases])

    return 1.0 - fit_conversation_head(fit, enc(fit), c).probs(enc(dev))[:, 0]


def six_class_p_high(fit: list[dict], fit_feats: np.ndarray, dev_feats: np.ndarray) -> np.ndarray:
    """1 - P(not high) of one six-class regression over the conversation head's features (the head of
    held-out run 3, before the shipped two-part head)."""
    from sklearn.linear_model import LogisticRegression

    mean, scale = fit_feats.mean(0), fit_feats.std(0) + 1e-6
    model = LogisticRegression(C=1.0, class_weight="balanced", max_iter=3000)
    model.fit((fit_feats - mean) / scale, case_labels(fit))
    return 1.0 - model.predict_proba((dev_feats - mean) / scale)[:, 0]


def learning_curve(fit: list[dict], fit_feats: np.ndarray, dev_feats: np.ndarray, yd: np.ndarray) -> dict:
    """Dev AUC of the shipped head's fit on random fractions of the fit cases (4 draws each): how much
    more tuning data of the same kind would buy."""
    from sklearn.metrics import roc_auc_score

    from escrag.safety.heads import fit_conversation_head

    rng, out = np.random.default_rng(0), {}
    for frac in (0.125, 0.25, 0.5, 0.75, 1.0):
        aucs = []
        for _ in range(4 if frac < 1 else 1):
            idx = np.sort(rng.choice(len(fit), int(frac * len(fit)), replace=False))
            head = fit_conversation_head([fit[i] for i in idx], fit_feats[idx], 1.0)
            aucs.append(roc_auc_score(yd > 0, 1.0 - head.probs(dev_feats)[:, 0]))
        out[str(int(frac * len(fit)))] = {"auc_mean": round(float(np.mean(aucs)), 4),
                                          "auc_sd": round(float(np.std(aucs)), 4)}
    return out


def other_readers(fit: list[dict], fit_feats: np.ndarray, dev_feats: np.ndarray) -> dict:
    """Non-linear heads over the same features and fit cases, P(high) on dev: whether the linear
    head leaves anything on the table."""
    from sklearn.neural_network import MLPClassifier
    from sklearn.svm import SVC

    mean, scale = fit_feats.mean(0), fit_feats.std(0) + 1e-6
    x, xd, high = (fit_feats - mean) / scale, (dev_feats - mean) / scale, case_labels(fit) > 0
    mlp = MLPClassifier((256,), alpha=0.01, max_iter=500, random_state=0).fit(x, high)
    svm = SVC(C=10.0, class_weight="balanced").fit(x, high)
    unit = lambda a: a / np.linalg.norm(a, axis=1, keepdims=True)  # noqa: E731
    nearest = np.argsort(-(unit(xd) @ unit(x).T), axis=1)[:, :5]
    return {"MLP (256 hidden) over the conversation head's features": mlp.predict_proba(xd)[:, 1],
            "RBF SVM (C 10) over the conversation head's features": 1.0 / (1.0 + np.exp(-svm.decision_function(xd))),
            "5 nearest fit cases (cosine) over the conversation head's features": high[nearest].mean(1)}


def prefix_max_probs(clf: RiskClassifier, cases: list[dict]) -> np.ndarray:
    """The conversation head over every prefix of a case that ends at a client turn; per case, the
    probabilities of the prefix with the highest P(high) (a risk stated early is read before later
    turns dilute the average)."""
    rows, owner = [], []
    for i, c in enumerate(cases):
        for j, m in enumerate(c["messages"]):
            if m["role"] == "user":
                rows.append(c["messages"][:j + 1])
                owner.append(i)
    probs, owner = clf.conv.probs(clf.backbone.features(rows)), np.array(owner)
    out = np.zeros((len(cases), probs.shape[1]), np.float32)
    for i in range(len(cases)):
        mine = probs[owner == i]
        out[i] = mine[np.argmin(mine[:, 0])]
    return out


def scores(p_high: np.ndarray, y: np.ndarray) -> dict:
    from sklearn.metrics import roc_auc_score

    out = {"auc": round(float(roc_auc_score(y > 0, p_high)), 4)} if len(set(p_high)) > 2 else {}
    for t in THRESHOLDS:
        pred = p_high >= t
        recall = {cat: round(float(pred[y == i + 1].mean()), 3) for i, cat in enumerate(CATEGORIES)}
        out[f"t={t}"] = {"recall": recall, "min_recall": min(recall.values()),
                         "not_high_flagged_high": round(float(pred[y == 0].mean()), 3)}
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=2, help="torch threads")
    args = p.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    t0 = time.time()
    sc = SafetyConfig()
    _, fit = fit_cases(sc)
    dev = [c for c in load_cases("tuning-round6") if dev_group(c)]
    shipped = RiskClassifier.from_config(sc)  # fits and caches the conversation head on `fit` (first run)
    before = RiskClassifier(dataclasses.replace(sc, backbone=None), shipped.embedder, shipped.head)
    rules = RiskClassifier(dataclasses.replace(sc, head=False, backbone=None))
    fit_feats = shipped.backbone.features([c["messages"] for c in fit], "reading the fit cases")
    dev_feats = shipped.backbone.features([c["messages"] for c in dev])
    yd = case_labels(dev)
    designs = {
        "before: rules only": levels(rules, dev),
        "before: rules + MiniLM sentence head (layers 1-4)": levels(before, dev),
        "MiniLM conversation embedding, C 0.1": minilm_p_high(fit, dev, 0.1),
        "conversation head alone, one six-class regression (run 3's)": six_class_p_high(fit, fit_feats, dev_feats),
        "conversation head alone (SmolLM2 L8+16+24, C 1)": 1.0 - shipped.conv.probs(dev_feats)[:, 0],
        "shipped: layers 1-5": levels(shipped, dev),
        **other_readers(fit, fit_feats, dev_feats),
    }
    prefix = prefix_max_probs(shipped, dev)
    designs["conversation head alone, max over client-turn prefixes"] = 1.0 - prefix[:, 0]
    designs["shipped with the prefix-max head: layers 1-5"] = np.array(
        [LEVEL[with_conversation(a, p, sc).level] for a, p in zip(before.assess_many([c["messages"] for c in dev]),
                                                                   prefix)])
    report = {"fit_cases": len(fit), "dev_cases": len(dev), "dev_high": int((yd > 0).sum()),
              "designs": {name: scores(ph, yd) for name, ph in designs.items()},
              "learning_curve": learning_curve(fit, fit_feats, dev_feats, yd)}
    report["seconds"] = round(time.time() - t0)
    write_json(OUT, report, indent=1)
    print(f"fit {report['fit_cases']} cases, dev {report['dev_cases']} ({report['dev_high']} high)")
    print(f"{'design':56s} {'AUC':>6s} {'t':>5s}  " + " ".join(f"{c[:9]:>9s}" for c in CATEGORIES) + "  flagged")
    for name, s in report["designs"].items():
        for t in (0.5, 0.95) if name.startswith(("before", "shipped")) else THRESHOLDS:  # a level: 0.95 = high
            r = s[f"t={t}"]
            print(f"{name[:56]:56s} {s.get('auc', float('nan')):6.3f} {t:5.2f}  "
                  + " ".join(f"{r['recall'][c]:9.2f}" for c in CATEGORIES) + f"  {r['not_high_flagged_high']:.3f}")
    print("learning curve (fit cases: dev AUC of the conversation head alone): " + ", ".join(
        f"{n}: {v['auc_mean']:.3f}" for n, v in report["learning_curve"].items()))
    print(f"wrote {OUT} ({report['seconds']} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
