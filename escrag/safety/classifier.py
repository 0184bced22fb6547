"""``RiskClassifier``: the five layers of ``escrag.safety`` over a conversation (``from_config(cfg)``,
``assess(history)``, ``assess_many(histories)``), with per-text caches of both heads."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from escrag.safety.backbone import Backbone, conv_dtype, render
from escrag.safety.heads import ConversationHead, EmbeddingHead, load_or_fit_conv_head, load_or_fit_head
from escrag.safety.turns import rule_hits
from escrag.safety.types import CATEGORIES, FIRM, LEVELS, Hit, RiskAssessment


def _assessment(hits: list[Hit]) -> RiskAssessment:
    rank = {"cue": 1, "elevated": 1, "high": 2}
    if not hits:
        return RiskAssessment()
    top = max(rank[h.level] for h in hits)
    level = LEVELS[top]
    cats = [c for c in CATEGORIES if any(h.category == c and rank[h.level] == top for h in hits)]
    shown = sorted(hits, key=lambda h: -rank[h.level])
    reasons = list(dict.fromkeys(h.reason() for h in shown))[:12]
    return RiskAssessment(level, cats, reasons, any(h.level == "high" and h.name in FIRM for h in hits))



def with_conversation(a: RiskAssessment, p: np.ndarray, sc, best: np.ndarray | None = None,
                      longest_turn: int = 0) -> RiskAssessment:
    """Layer 5 over the level of layers 1-4 (``a``), given the conversation head's [6] probabilities
    (not high, then CATEGORIES) for the whole conversation, the ``safety`` config section, and the
    probabilities of its prefix with the highest P(high) (default ``p``). That prefix decides whether
    1-4's high is confirmed, so a later turn cannot talk an earlier risk away (averaged over the
    whole conversation, a few odd words at the end took a stated overdose plan from P 0.84 to 0.00).
    ``longest_turn``: the conversation's longest turn in characters; past ``conv_veto_max_turn_chars``
    the head is read outside what it was fitted on and cannot lower 1-4's high (one ordinary turn
    repeated to 5,900 characters took a crisis after it to P 0.00)."""
    p_high, cat = float(1.0 - p[0]), CATEGORIES[int(np.argmax(p[1:]))]
    best_high = p_high if best is None else float(1.0 - best[0])
    why = f"conversation head p={p_high:.2f} ({cat})" + (f", {best_high:.2f} up to an earlier client turn"
                                                         if best_high > p_high + 0.005 else "")
    unread = longest_turn > sc.conv_veto_max_turn_chars  # outside what the head was fitted on
    if a.level == "high" and (a.firm or best_high >= sc.conv_confirm or unread):
        return RiskAssessment("high", a.categories, a.reasons + [why])
    if p_high >= sc.conv_high:
        return RiskAssessment("high", [cat], [why] + a.reasons)
    if a.level == "high":
        return RiskAssessment("elevated", a.categories, [f"{why}: below {sc.conv_confirm}, the high findings "
                                                         f"below count as elevated"] + a.reasons)
    if p_high >= sc.conv_elevated:
        return RiskAssessment("elevated", a.categories if a.level == "elevated" else [cat], a.reasons + [why])
    return a



def conversation_reads(history: list[dict]) -> list[list[dict]]:
    """What the conversation head reads of a conversation: each prefix ending at a client turn, then
    the whole of it."""
    return [history[:j + 1] for j, m in enumerate(history) if m.get("role") == "user"] + [history]


def _inline(fn, *args):
    return fn(*args)


class RiskClassifier:
    """``RiskClassifier.from_config(cfg)`` once per process, then ``assess(history)``."""

    def __init__(self, cfg, embedder=None, head: EmbeddingHead | None = None, run=None,
                 backbone: Backbone | None = None, conv: ConversationHead | None = None):
        """``run(fn, *args)``: where the models' torch work runs (default: the calling thread); a
        process that hosts a transformers engine passes ``engine.call`` (one OpenMP pool,
        ``rollout/engines/hf_engine.py``)."""
        self.cfg, self.embedder, self.head = cfg, embedder, head  # cfg: escrag.config.SafetyConfig
        self.backbone, self.conv = backbone, conv  # the conversation head (layer 5), or None
        self._run = run or _inline
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()  # sentence -> sentence head's probabilities
        self._conv_cache: OrderedDict[str, np.ndarray] = OrderedDict()  # rendered prefix -> conversation head's

    @classmethod
    def from_config(cls, cfg, run=None) -> RiskClassifier:
        """From a full ``Config`` (its ``safety`` section) or a ``SafetyConfig``: loads the embedder and
        the head fitted on ``safety.tuning``, and the backbone and the conversation head fitted on
        ``safety.conv_tuning`` (both cached under $ESCRAG_CACHE; fitted on first use)."""
        sc, run = getattr(cfg, "safety", cfg), run or _inline
        embedder = head = backbone = conv = None
        if sc.head:
            from escrag.embed import load_embedder

            embedder = run(load_embedder, sc.embedder)
            head = run(load_or_fit_head, sc, embedder)
        if sc.backbone:
            backbone = run(Backbone, sc.backbone, sc.conv_layers, sc.conv_batch, sc.conv_device, conv_dtype(sc))
            conv = run(load_or_fit_conv_head, sc, backbone)
        return cls(sc, embedder, head, run, backbone, conv)

    def _cached(self, cache: OrderedDict, keys: list[str], items: list, compute) -> np.ndarray:
        """[len(keys), 6] probabilities: cached per key, ``compute(items of the missing keys)`` for the
        rest; least recently used keys beyond ``safety.cache_size`` are dropped."""
        todo = {k: item for k, item in zip(keys, items) if k not in cache}
        if todo:
            for k, p in zip(todo, compute(list(todo.values()))):
                cache[k] = p
        out = np.stack([cache[k] for k in keys]) if keys else np.zeros((0, len(CATEGORIES) + 1))
        for k in keys:
            cache.move_to_end(k)
        while len(cache) > self.cfg.cache_size:
            cache.popitem(last=False)
        return out

    def _probs(self, sentences: list[str]) -> np.ndarray:
        return self._cached(self._cache, sentences, sentences,
                            lambda todo: self.head.probs(self._run(self.embedder.encode, todo)))

    def _conv_probs(self, histories: list[list[dict]]) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per conversation, the conversation head's probabilities for the whole of it and for its
        prefix (ending at a client turn) with the highest P(high). Each distinct text is read once
        (a GRPO group's samples share their prefixes; a chat re-sends its history)."""
        reads = [conversation_reads(h) for h in histories]
        flat = [r for rs in reads for r in rs]
        probs = self._cached(self._conv_cache, [render(r) for r in flat], flat,
                             lambda todo: self.conv.probs(self._run(self.backbone.features, todo)))
        out, i = [], 0
        for rs in reads:
            rows, i = probs[i:i + len(rs)], i + len(rs)
            out.append((rows[-1], rows[int(np.argmin(rows[:, 0]))]))
        return out

    def _head_hits(self, sentences: list[tuple[int, str, set[str]]], probs: np.ndarray,
                   rule: list[Hit]) -> list[Hit]:
        """High when the head is sure (``head_high``), or fairly sure (``head_cue``) and the rules saw
        a cue of the same category in the same client turn; elevated above ``head_elevated``."""
        hits = []
        for (turn, s, lowered), p in zip(sentences, probs):
            category = CATEGORIES[int(np.argmax(p[1:]))]
            p_high = float(1.0 - p[0])
            if len(s.split()) < self.cfg.head_min_words or p_high < self.cfg.head_elevated:
                continue
            capped = bool(lowered - {"high_rule"})  # negated, past, fiction, joke or idiom
            cue = any(h.turn == turn and h.category == category for h in rule)
            sure = p_high >= self.cfg.head_high or (cue and p_high >= self.cfg.head_cue)
            hits.append(Hit(category, "high" if sure and not capped else "elevated",
                            f"embedding p={p_high:.2f}" + (" with a rule cue" if cue else ""), turn, s))
        return hits

    def assess_many(self, histories: list[list[dict]]) -> list[RiskAssessment]:
        """Assess a batch of conversations; the head embeds each distinct sentence once."""
        parsed = [rule_hits(self._window(h)) for h in histories]
        if self.head is not None:
            probs = self._probs([s for _, sents in parsed for _, s, _ in sents])
        out, i = [], 0
        for hits, sents in parsed:
            if self.head is not None:
                hits = hits + self._head_hits(sents, probs[i:i + len(sents)], hits)
                i += len(sents)
            out.append(_assessment(hits))
        if self.conv is not None and histories:
            windows = [self._window(h) for h in histories]
            out = [with_conversation(a, whole, self.cfg, best, max(len(m.get("content") or "") for m in w))
                   for a, w, (whole, best) in zip(out, windows, self._conv_probs(windows))]
        return out

    def assess(self, history: list[dict]) -> RiskAssessment:
        """Risk of a conversation ([{"role": "user" | "assistant", "content": str}, ...])."""
        return self.assess_many([history])[0]

    def _window(self, history: list[dict]) -> list[dict]:
        if self.cfg.max_client_turns is None:
            return history
        users = [i for i, m in enumerate(history) if m.get("role") == "user"]
        start = users[-self.cfg.max_client_turns] if len(users) > self.cfg.max_client_turns else 0
        return history[start:]
