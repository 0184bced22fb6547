"""The crisis check's conversation head: a language model's reading of the whole conversation.

Owns: ``ConversationHead`` (a logistic regression for high vs not high and a softmax regression for
the category of a high case, over standardised features), ``Backbone`` (``safety.backbone``'s hidden
states at ``safety.conv_layers``, each averaged over the tokens of the rendered conversation followed by a risk question), the fit on
the tuning cases (``fit_conversation_head``; cached under $ESCRAG_CACHE by ``load_or_fit_conv_head``)
and ``dev_group``, the split of the tuning cases that keeps round 6's dev half out of every fit.

Why. Rules and a head over single-sentence MiniLM embeddings fit their tuning set (recall ~1.0) but
caught 0.54-0.80 of new wordings. On round 6's dev half (results/safety-designs) a regression over
SmolLM2-135M's mid-layer states of the whole conversation separates high from not high better (AUC
0.96 vs 0.82 for the shipped levels) than any MiniLM feature (0.83-0.85). ``escrag.safety`` combines
it with the rules and the sentence head; it reads every turn, the counselor's included.

Data. Fitted on ``safety.conv_tuning`` (default data/safety/tuning.jsonl, tuning-round6.jsonl and
tuning-round7.jsonl), less the cases of round 6's dev groups: those and data/safety/eval.jsonl are
never fitted on. The paper has no safety layer; this is ours.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

QUESTION = ("\n\nQuestion: Is anyone in this conversation in immediate danger of suicide, self-harm, "
            "violence, abuse or a medical emergency? Answer:")
MAX_CHARS = 2000  # the conversation's last characters that are read (the question is always whole)
HEAD_VERSION = 2  # bump when the features or the fit change (invalidates cached heads)


def dev_group(case: dict) -> bool:
    """True for a case of round 6's dev half: its ``group`` (a case with its multi-turn and texting
    versions) hashes odd, so versions never straddle the split. Cases without a group are fit cases."""
    g = case.get("group")
    return g is not None and hashlib.sha256(g.encode()).digest()[0] % 2 == 1


def render(history: list[dict]) -> str:
    """The conversation as the backbone reads it: its last ``MAX_CHARS`` characters, then the question."""
    text = "\n".join(("Client: " if m.get("role") == "user" else "Counselor: ") + (m.get("content") or "")
                     for m in history)
    return text[-MAX_CHARS:] + QUESTION


class Backbone:
    """``features(histories) -> [n, len(layers) * hidden]``: the model's hidden states after each of
    ``layers`` averaged over the tokens of ``render(history)``. Right padding, so a row's states do
    not depend on its batch (causal attention) but in bfloat16's last bits; bfloat16 autocast over
    float32 weights, on the CPU or a GPU (``safety.conv_device``; a backbone larger than the default is a GPU's job)."""

    def __init__(self, spec: str, layers: list[int], batch: int, device: str = "cpu"):
        import torch

        from escrag.models import load_causal_lm, load_tokenizer, resolve_device

        self.device = resolve_device(device)
        self.tok, self.lm = load_tokenizer(spec), load_causal_lm(spec, "float32").eval().to(self.device)
        self.tok.padding_side = "right"
        if self.tok.pad_token is None:
            self.tok.pad_token = self.tok.eos_token
        n = self.lm.config.num_hidden_layers
        if any(not 1 <= k <= n for k in layers):
            from escrag.config import ConfigError

            raise ConfigError(f"safety.conv_layers: each must be in 1..{n} for {spec}, got {layers}")
        # the layers past the deepest one read (but one: the last hidden state is the normed one) and
        # the LM head are never needed: on SmolLM2 with layers up to 24 of 30, a third of the compute
        keep = min(n, max(layers) + 1)
        self.lm.model.layers = self.lm.model.layers[:keep]
        self.lm.config.num_hidden_layers = keep
        self.spec, self.layers, self.batch, self._torch = spec, list(layers), batch, torch

    def features(self, histories: list[list[dict]], progress: str | None = None) -> np.ndarray:
        """``progress``: a progress bar with this label (for long passes)."""
        from tqdm import tqdm

        texts = [render(h) for h in histories]
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))  # similar lengths batch together
        out = [None] * len(texts)
        for s in tqdm(range(0, len(order), self.batch), desc=progress, unit="batch", disable=progress is None):
            idx = order[s:s + self.batch]
            for i, row in zip(idx, self._forward([texts[i] for i in idx])):
                out[i] = row
        return np.stack(out) if out else np.zeros((0, len(self.layers) * self.lm.config.hidden_size), np.float32)

    def _forward(self, texts: list[str]) -> np.ndarray:
        torch = self._torch
        enc = self.tok(texts, return_tensors="pt", padding=True).to(self.device)
        with torch.inference_mode(), torch.autocast(torch.device(self.device).type, dtype=torch.bfloat16):
            hs = self.lm.model(**enc, output_hidden_states=True).hidden_states
        mask = enc.attention_mask.unsqueeze(-1).float()
        pooled = [(hs[k].float() * mask).sum(1) / mask.sum(1) for k in self.layers]
        return torch.cat(pooled, dim=1).cpu().numpy()


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


def softmax(z: np.ndarray) -> np.ndarray:
    """Row-wise softmax of [n, classes] logits (both heads' probabilities)."""
    z = np.exp(z - z.max(axis=1, keepdims=True))
    return z / z.sum(axis=1, keepdims=True)


def case_labels(cases: list[dict]) -> np.ndarray:
    """A case's class: 0 not high, 1 + the category's index in ``CATEGORIES`` when high."""
    from escrag.safety import CATEGORIES

    return np.array([0 if k["label"] != "high" else 1 + CATEGORIES.index(k["category"]) for k in cases])


def fit_conversation_head(cases: list[dict], feats: np.ndarray, c: float) -> ConversationHead:
    """L2 logistic regressions with balanced class weights on one feature row per case: high vs not
    high on every case, the category on the high cases. Why two: on round 6's dev half the binary
    P(high) separates better (AUC 0.963) than 1 - P(not high) of one six-class regression (0.951),
    which spends its fit on telling the categories apart."""
    from sklearn.linear_model import LogisticRegression

    from escrag.data import DataError
    from escrag.safety import CATEGORIES

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


def fit_cases(sc) -> tuple[list[Path], list[dict]]:
    """The files of ``safety.conv_tuning`` and their cases less round 6's dev groups."""
    from escrag.data import DataError
    from escrag.safety import load_cases, resolve_cases

    paths = [resolve_cases(name) for name in sc.conv_tuning]
    for p in paths:
        if not p.is_file():
            raise DataError(f"{p}: no such safety tuning file (safety.conv_tuning)")
    return paths, [c for p in paths for c in load_cases(p) if not dev_group(c)]


def conv_head_key(sc) -> str:
    """The cache key of the head for ``sc``: the tuning files' bytes and the settings it depends on."""
    h = hashlib.sha256()
    for p in fit_cases(sc)[0]:
        h.update(p.read_bytes())
    h.update(f"{HEAD_VERSION}|{sc.backbone}|{sc.conv_layers}|{sc.conv_c}".encode())
    return h.hexdigest()[:16]


def load_or_fit_conv_head(sc, backbone: Backbone) -> ConversationHead:
    """The head for ``safety.conv_tuning`` / ``backbone`` / ``conv_layers`` / ``conv_c``: shipped
    (``escrag.safety.head_file``), else fitted now (one backbone pass over the fit cases: ~1.5 min
    on 2 cores) and cached under $ESCRAG_CACHE."""
    from escrag.safety import head_file

    with np.load(head_file(f"safety-conv-{conv_head_key(sc)}", lambda: fit_conv_arrays(sc, backbone))) as z:
        return ConversationHead(z["mean"], z["scale"], z["weight"], z["bias"])


def fit_conv_arrays(sc, backbone: Backbone) -> dict:
    """Fit the head on ``fit_cases(sc)``; its arrays."""
    cases = fit_cases(sc)[1]
    feats = backbone.features([c["messages"] for c in cases], f"safety conversation head: reading {len(cases)} "
                                                               f"tuning cases (first use only)")
    return fit_conversation_head(cases, feats, sc.conv_c).arrays()
