"""The crisis check's two fitted heads, and where their arrays come from.

Owns: ``ConversationHead`` (a logistic regression for high vs not high and a softmax regression for
the category of a high case, over standardised features, read from ``escrag.safety.backbone``), the fit on the tuning cases
(``fit_conversation_head``; cached under $ESCRAG_CACHE by ``load_or_fit_conv_head``) less round 6's
dev half (``escrag.safety.cases.dev_group``).

Why. Rules and a head over single-sentence MiniLM embeddings fit their tuning set (recall ~1.0) but
caught 0.54-0.80 of new wordings. On round 6's dev half (experiments/safety_designs) a regression over
SmolLM2-135M's mid-layer states of the whole conversation separates high from not high better (AUC
0.96 vs 0.82 for the shipped levels) than any MiniLM feature (0.83-0.85). ``escrag.safety`` combines
it with the rules and the sentence head; it reads every turn, the counselor's included.

Data. Fitted on ``safety.conv_tuning`` (default data/safety/tuning.jsonl, tuning-round6.jsonl and
tuning-round7.jsonl), less the cases of round 6's dev groups: those and data/safety/eval.jsonl are
never fitted on. The paper has no safety layer; this is ours.

Also owns ``EmbeddingHead`` (layer 4: a softmax regression over single-sentence MiniLM embeddings,
fitted on ``safety.tuning`` with multiple-instance rounds) and ``head_file`` (a head shipped in
data/safety/heads/, else fitted once and cached under $ESCRAG_CACHE).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from escrag.data import DataError
from escrag.models import build_once
from escrag.safety.backbone import Backbone
from escrag.safety.cases import SAFETY_DIR, case_labels, fit_cases, load_cases, resolve_cases
from escrag.safety.turns import rule_hits
from escrag.safety.types import CATEGORIES, softmax

HEADS_DIR = SAFETY_DIR / "heads"  # the default config's fitted heads, shipped (``head_file``)

HEAD_VERSION = 1  # bump when the head's features or fitting change (invalidates cached heads)

CONV_HEAD_VERSION = 2  # the conversation head's: bump when its features or fit change


# ------------------------------------------------------------------------------ embedding head


class EmbeddingHead:
    """Softmax regression over sentence embeddings: class 0 is not high, class i the i-th category."""

    def __init__(self, weight: np.ndarray, bias: np.ndarray):
        self.weight, self.bias = weight.astype(np.float32), bias.astype(np.float32)  # [dim, 6], [6]

    def probs(self, vecs: np.ndarray) -> np.ndarray:
        """[n, dim] unit-norm embeddings -> [n, 6] class probabilities."""
        return softmax(vecs @ self.weight + self.bias)

    @classmethod
    def fit(cls, vecs: np.ndarray, labels: np.ndarray, c: float) -> EmbeddingHead:
        """L2-regularised softmax regression with balanced class weights (scikit-learn's lbfgs)."""
        from sklearn.linear_model import LogisticRegression

        model = LogisticRegression(C=c, class_weight="balanced", max_iter=2000)
        model.fit(vecs, labels)
        if len(model.classes_) != len(CATEGORIES) + 1:
            raise DataError(f"the safety tuning set needs high cases of every category ({', '.join(CATEGORIES)}) "
                            f"and not-high cases")
        return cls(model.coef_.T, model.intercept_)


def _case_sentences(case: dict) -> list[str]:
    return [s for _, s, _ in rule_hits(case["messages"])[1]]


def fit_head(cases: list[dict], encode, c: float, rounds: int) -> EmbeddingHead:
    """Fit the head on tuning cases. A not-high case gives all its client sentences to class 0; a
    high case gives one sentence to its category: at first the one the rules flag (else its longest),
    then, for ``rounds`` rounds, the one the current head finds most likely high (multiple-instance)."""
    sents = [_case_sentences(c) for c in cases]
    flat = sorted({s for ss in sents for s in ss})
    index = {s: i for i, s in enumerate(flat)}
    vecs = encode(flat)
    pick = [max(ss, key=lambda s: (bool(rule_hits([{"role": "user", "content": s}])[0]), len(s))) for ss in sents]
    head = None
    for r in range(rounds + 1):
        if r:
            pick = [max(ss, key=lambda s: 1 - head.probs(vecs[index[s]][None])[0, 0]) for ss in sents]
        rows, labels = [], []
        for case, ss, p in zip(cases, sents, pick):
            if case["label"] == "high":
                rows.append(index[p])
                labels.append(1 + CATEGORIES.index(case["category"]))
            else:
                rows += [index[s] for s in ss]
                labels += [0] * len(ss)
        head = EmbeddingHead.fit(vecs[rows], np.array(labels), c)
    return head




def head_key(sc, tuning: Path) -> str:
    h = hashlib.sha256(tuning.read_bytes())
    h.update(f"{HEAD_VERSION}|{sc.embedder}|{sc.head_c}|{sc.head_rounds}".encode())
    return h.hexdigest()[:16]


def load_or_fit_head(sc, embedder) -> EmbeddingHead:
    """The head for ``sc.tuning`` and ``sc.embedder``: shipped (``head_file``), else fitted now (under
    an inter-process lock, written atomically) and cached; a changed tuning file gets a new head."""
    tuning = resolve_cases(sc.tuning)
    if not tuning.is_file():
        raise DataError(f"{tuning}: no such safety tuning file (safety.tuning)")

    with np.load(head_file(f"safety-head-{head_key(sc, tuning)}", lambda: fit_head_arrays(sc, tuning, embedder))) as z:
        return EmbeddingHead(z["weight"], z["bias"])


def fit_head_arrays(sc, tuning: Path, embedder) -> dict:
    """Fit the sentence head on ``tuning``; its arrays."""
    head = fit_head(load_cases(tuning), embedder.encode, sc.head_c, sc.head_rounds)
    return {"weight": head.weight, "bias": head.bias}


def head_file(name: str, fit) -> Path:
    """The .npz of head ``name`` (its key hashes the tuning files and settings): the one shipped in
    data/safety/heads/ (``escrag safety fit-heads``: the default config's heads, so that a fresh
    machine skips the fits), else ``fit()``'s arrays, saved once under $ESCRAG_CACHE."""
    shipped = HEADS_DIR / f"{name}.npz"
    if shipped.is_file():
        return shipped
    return build_once(name, lambda tmp: np.savez(tmp / "head.npz", **fit())) / "head.npz"




class ConversationHead:
    """Two regressions over standardised features, one weight matrix: column 0 the logit of high vs not
    high, columns 1-5 the categories' logits given high. ``probs`` gives [n, 6]: P(not high), then
    P(high) * P(category | high)."""

    def __init__(self, mean: np.ndarray, scale: np.ndarray, weight: np.ndarray, bias: np.ndarray):
        self.mean, self.scale = mean.astype(np.float32), scale.astype(np.float32)  # [dim]
        self.weight, self.bias = weight.astype(np.float32), bias.astype(np.float32)  # [dim, 6], [6]

    def probs(self, feats: np.ndarray) -> np.ndarray:
        z = ((feats - self.mean) / self.scale) @ self.weight + self.bias
        p_high = 1.0 / (1.0 + np.exp(-z[:, :1]))
        return np.concatenate([1.0 - p_high, p_high * softmax(z[:, 1:])], axis=1)

    def arrays(self) -> dict:
        return {"mean": self.mean, "scale": self.scale, "weight": self.weight, "bias": self.bias}



def fit_conversation_head(cases: list[dict], feats: np.ndarray, c: float) -> ConversationHead:
    """L2 logistic regressions with balanced class weights on one feature row per case: high vs not
    high on every case, the category on the high cases. Why two: on round 6's dev half the binary
    P(high) separates better (AUC 0.963) than 1 - P(not high) of one six-class regression (0.951),
    which spends its fit on telling the categories apart."""
    from sklearn.linear_model import LogisticRegression

    labels = case_labels(cases)
    if len(set(labels.tolist())) != len(CATEGORIES) + 1:
        raise DataError(f"safety.conv_tuning needs high cases of every category ({', '.join(CATEGORIES)}) "
                        f"and not-high cases")
    mean, scale = feats.mean(0), feats.std(0) + 1e-6
    x, high = (feats - mean) / scale, labels > 0
    binary = LogisticRegression(C=c, class_weight="balanced", max_iter=3000).fit(x, high)
    category = LogisticRegression(C=c, class_weight="balanced", max_iter=3000).fit(x[high], labels[high])
    return ConversationHead(mean, scale, np.concatenate([binary.coef_.T, category.coef_.T], axis=1),
                            np.concatenate([binary.intercept_, category.intercept_]))



def conv_head_name(sc, dtype: str) -> str:
    """The name of the head for ``sc`` read in ``dtype`` (the backbone's resolved ``conv_dtype``): its
    key hashes the tuning files' bytes and the settings it depends on. A float32 head is named apart;
    a bfloat16 one keeps the name it had before ``conv_dtype`` existed, so shipped heads still load."""
    h = hashlib.sha256()
    for p in fit_cases(sc)[0]:
        h.update(p.read_bytes())
    h.update(f"{CONV_HEAD_VERSION}|{sc.backbone}|{sc.conv_layers}|{sc.conv_c}".encode())
    return f"safety-conv-{'float32-' if dtype == 'float32' else ''}{h.hexdigest()[:16]}"


def load_or_fit_conv_head(sc, backbone: Backbone) -> ConversationHead:
    """The head for ``safety.conv_tuning`` / ``backbone`` / ``conv_layers`` / ``conv_c``: shipped
    (``head_file``), else fitted now (one backbone pass over the fit cases: ~1.5 min
    on 2 cores) and cached under $ESCRAG_CACHE."""
    with np.load(head_file(conv_head_name(sc, backbone.dtype), lambda: fit_conv_arrays(sc, backbone))) as z:
        return ConversationHead(z["mean"], z["scale"], z["weight"], z["bias"])


def fit_conv_arrays(sc, backbone: Backbone) -> dict:
    """Fit the head on ``fit_cases(sc)``; its arrays."""
    cases = fit_cases(sc)[1]
    feats = backbone.features([c["messages"] for c in cases], f"safety conversation head: reading {len(cases)} "
                                                               f"tuning cases (first use only)")
    return fit_conversation_head(cases, feats, sc.conv_c).arrays()
