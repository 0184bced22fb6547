"""The crisis check of a conversation, and the reply that names where to get help at high risk.

Owns: ``RiskClassifier`` (``from_config(cfg)``, ``assess(history)``, ``assess_many(histories)``),
``RiskAssessment`` (level none / elevated / high, categories, reasons), the metric helpers
(``with_answer``, ``level_counts``), the embedding head fitted on
``data/safety/tuning.jsonl``, the crisis data sets' reader (``load_cases``) and ``safety_reply``.
Three layers use it: the counselor API (every reply), the GRPO rollouts and the evaluation (a
reported metric). The categories and levels are those of docs/safety.md.

How a conversation is read (every client turn, not only the last one):
1. Rules (``escrag.safety_rules``) on each sentence of each client turn, after normalisation
   (contractions, chat spellings, misspelt risk words repaired by edit distance). A high rule under a
   negation ("I would never ...") or in a resolved past ("years ago ... she's fine now") counts as
   elevated; inside fiction, news, a joke or an idiom ("this exam is killing me") it does not count.
2. Combinations of cues across the whole conversation (``COMBOS``): ideation in one turn and means at
   hand or a time in another is high ("I don't see the point" ... "I've got my dad's pills").
3. An answer to the counselor's risk question ("Do you have a plan?" "yes").
4. The embedding head: a multinomial logistic regression on all-MiniLM-L6-v2 embeddings of single
   sentences, fitted on the tuning set with multiple-instance rounds (a high conversation needs only
   one high sentence). It catches phrasings the rules lack; a sentence the rules found negated, past,
   fictional or idiomatic is capped at elevated.
The level of 1-4 is the highest level found; ``reasons`` says what fired on which words.
5. The conversation head (``escrag.safety_conv``, ``safety.backbone``): P(high) from a language
   model's reading of the whole conversation (to confirm 1-4's high: the highest over its prefixes
   that end at a client turn, so a later turn cannot talk an earlier risk away). High when it is
   sure (``conv_high``), or when 1-4 said high and it agrees at least a little (``conv_confirm``; below that, 1-4's high is lowered to
   elevated, except a yes to the counselor's direct question, ``FIRM``); at least elevated above
   ``conv_elevated``. On round 6's dev half this cut the misses
   and the false alarms of 1-4 alone (results/safety-designs).

A screening aid that errs towards flagging, not a clinical instrument. The paper has no safety
layer; this is ours.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections import OrderedDict
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np

from escrag import safety_rules as R
from escrag.data import DataError, read_jsonl
from escrag.safety_conv import Backbone, ConversationHead, load_or_fit_conv_head, render, softmax

LEVELS = ("none", "elevated", "high")
CATEGORIES = ("suicide", "self_harm", "harm_to_others", "abuse", "medical")
SAFETY_DIR = Path(__file__).resolve().parent.parent / "data" / "safety"
HEADS_DIR = SAFETY_DIR / "heads"  # the default config's fitted heads, shipped (``head_file``)
HEAD_VERSION = 1  # bump when the head's features or fitting change (invalidates cached heads)


# ------------------------------------------------------------------------------ results


@dataclass
class RiskAssessment:
    level: str = "none"  # one of LEVELS
    categories: list[str] = field(default_factory=list)  # categories that reached ``level``
    reasons: list[str] = field(default_factory=list)  # what fired, on which words, in which turn
    firm: bool = False  # high from a finding the conversation head may not lower (``FIRM``)

    def to_dict(self) -> dict:
        return {"risk": self.level, "categories": list(self.categories), "reasons": list(self.reasons)}


@dataclass(frozen=True)
class Hit:
    category: str
    level: str  # high | elevated | cue
    name: str  # the rule's name (a cue's name is what COMBOS look for)
    turn: int  # index of the client turn (0 = first)
    text: str  # the words it fired on

    def reason(self) -> str:
        return f"{self.category}/{self.name} ({self.level}) in client turn {self.turn + 1}: '{self.text[:100]}'"


FIRM = ("answer_to_question",)  # a yes to the counselor's direct risk question: high whatever layer 5 reads


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


# ------------------------------------------------------------------------------ rules over turns


def client_turns(history: list[dict]) -> list[tuple[str, str]]:
    """(the counselor's turn just before, the client's turn) for each client turn of ``history``."""
    out, prev = [], ""
    for m in history:
        role, content = m.get("role"), m.get("content") or ""
        if role == "user":
            out.append((prev, content))
            prev = ""
        elif role == "assistant":
            prev = content
    return out


@lru_cache(maxsize=32768)
def sentence_hits(sentence: str, turn_resolved: bool) -> tuple[tuple[Hit, ...], frozenset[str]]:
    """Rule hits of one normalised sentence (turn 0; callers set the turn), and the modifiers that
    lowered any of them. Cached: a chat re-sends its history with every request."""
    hits, lowered = [], set()
    idioms = R.idiom_spans(sentence)
    is_joke = R.joke(sentence)
    for rule in R.RULES:
        for m in rule.pattern.finditer(sentence):
            if any(a < m.end() and m.start() < b for a, b in idioms):
                lowered.add("idiom")
                continue
            a, b = R.clause_span(sentence, m.start())
            c, d = R.clause_span(sentence, max(m.start(), m.end() - 1))
            neg = R.negated(sentence[a:b], m.start() - a) or (
                rule.inner_negation and R.NEGATOR.search(" ".join(m.group(0).split()[:3])) is not None)
            leisure = rule.name in ("method_research", "weapon") and R.leisure(sentence)
            leisure = leisure or R.ordinary(rule.name, sentence)
            why = ("media" if R.media(sentence[a:b]) or R.media(sentence[c:d]) or leisure else "joke" if is_joke else
                   "negated" if neg else
                   "past" if R.past_resolved(sentence[c:d], turn_resolved) else None)
            if why is None:
                hits.append(Hit(rule.category, rule.level, rule.name, 0, m.group(0)))
                continue
            lowered.add(why)
            if rule.level == "high" and why in ("negated", "past"):
                hits.append(Hit(rule.category, "elevated", f"{rule.name} ({why})", 0, m.group(0)))
    if any(h.level == "high" for h in hits):
        lowered.add("high_rule")
    return tuple(hits), frozenset(lowered)


_ASK = [  # (category, the counselor's question names this risk)
    ("suicide", re.compile(r"\b(?:suicide|suicidal|kill(?:ing)? (?:yourself|your self)|end(?:ing)? (?:your|it all|your own) "
                           r"(?:life|lives)?|take your (?:own )?life|not (?:be|being) (?:here|alive)|want(?:ing)? to die|"
                           r"(?:plan|planned|thought about how|means|pills|gun|rope) (?:to|for|of) (?:end|die|kill|hurt|doing it))\b")),
    ("self_harm", re.compile(r"\b(?:hurt(?:ing)? yourself|harm(?:ing)? yourself|cut(?:ting)? yourself(?! (?:some )?slack)|"
                             r"self harm|burn(?:ing)? yourself|still bleeding|need(?:s)? stitches)\b")),
    ("harm_to_others", re.compile(r"\b(?:hurt(?:ing)? (?:him|her|them|someone|anyone|somebody)|harm(?:ing)? (?:him|her|them|"
                                  r"someone|anyone)|kill(?:ing)? (?:him|her|them|someone)|(?:a|the) (?:weapon|gun|knife) with you)\b")),
    ("abuse", re.compile(r"\b(?:hurt(?:s|ing)? you|hit(?:s|ting)? you|threaten(?:ed|s|ing)? (?:to kill )?you|unsafe at home|"
                         r"afraid (?:of|for) (?:him|her|them|your life)|kill you|in danger)\b")),
    ("medical", re.compile(r"\b(?:what|how (?:many|much)) (?:did you|have you) (?:take|taken|swallow|swallowed|drink|drunk|drank)\b|"
                           r"\b(?:overdose|overdosed)\b")),
]
_YES = re.compile(r"^(?:yes|yeah|yea|yep|yup|ya|mhm|uh huh|honestly,? yes|kind of|kinda|sort of|maybe|a bit|a little|"
                  r"sometimes|i think so|probably|definitely|all the time|every day|constantly|more than ever|of course)\b|"
                  r"^(?:i do|i did|i am|i have|i will|a lot|often|a few|some|all of them|the whole)\W*(?:\w+\W*){0,3}$")
_SOFT_YES = re.compile(r"^(?:kind of|kinda|sort of|maybe|a bit|a little|sometimes|i think so|probably)\b")


def _asked(question: str) -> str | None:
    """The risk category the counselor's question asks about ("Do you have a plan to end your life?")."""
    q = R.normalize(question)
    if "?" not in q:
        return None
    last = q.split("?")[-2]
    return next((category for category, pat in _ASK if pat.search(last)), None)


SUICIDE_CUES = ("ideation", "means", "timing", "plan", "decision", "prep")


def _suicide_combo(hits: list[Hit]) -> list[Hit]:
    """Two different kinds of suicide cue anywhere in the client turns (ideation and means, a decision
    and a date, ...) are high; an elevated suicide statement counts as ideation."""
    kinds: dict[str, Hit] = {}
    for h in hits:
        if h.category != "suicide":
            continue
        kind = h.name if h.level == "cue" and h.name in SUICIDE_CUES else "ideation" if h.level == "elevated" else None
        if kind == "prep" and "prep" in kinds and kinds["prep"].text != h.text:
            kind = "prep2"  # two different preparations (debts repaid, things left clean) count twice
        if kind and kind not in kinds:
            kinds[kind] = h
    if len(kinds) < 2:
        return []
    found = list(kinds.values())[:3]
    return [Hit("suicide", "high", "combination", max(h.turn for h in found),
                " + ".join(f"{h.name}: {h.text}" for h in found))]


COMBOS = [  # (category, one predicate per cue needed; the cues may sit in different client turns)
    ("harm_to_others", (lambda h: h.name == "weapon",
                        lambda h: h.category == "harm_to_others" and h.name in ("anger", "anger_verb", "target"))),
    ("harm_to_others", (lambda h: h.name == "target", lambda h: h.name == "anger_verb")),
    ("abuse", (lambda h: h.category == "abuse" and h.name in ("physical", "danger"),
               lambda h: h.name in ("weapon", "danger", "physical") or h.category == "abuse" and h.level == "high")),
    ("self_harm", (lambda h: h.category == "self_harm" and h.name == "act", lambda h: h.name == "urge_now")),
    ("self_harm", (lambda h: h.category == "self_harm" and h.name == "act",
                   lambda h: h.name == "symptom" or h.category == "self_harm" and h.name == "escalation")),
    ("medical", (lambda h: h.name == "intox", lambda h: h.name == "symptom")),
]


def _combos(hits: list[Hit]) -> list[Hit]:
    """A high hit for each combination whose cues are all present (as different hits)."""
    out = _suicide_combo(hits)
    for category, needs in COMBOS:
        found = []
        for need in needs:
            match = next((h for h in hits if need(h) and h not in found), None)
            if match is None:
                break
            found.append(match)
        if len(found) < len(needs):
            continue
        if category in ("medical", "self_harm") and max(h.turn for h in found) - min(h.turn for h in found) > 1:
            continue  # a symptom next to a drink or a cut only counts in the same or the next client turn
        if True:
            text = " + ".join(f"{h.name}: {h.text}" for h in found)
            out.append(Hit(category, "high", "combination", max(h.turn for h in found), text))
    return out


DENIABLE = ("ideation_active", "anger_verb")  # thoughts and wishes a denial in the same turn lowers
STOPPABLE = ("means", "intent_now", "ideation_active")  # what "I put it down" in the same turn lowers


def _lower(h: Hit, why: str) -> Hit:
    return dataclasses.replace(h, level="elevated", name=f"{h.name} ({why})")


def rule_hits(history: list[dict]) -> tuple[list[Hit], list[tuple[int, str, set[str]]]]:
    """All rule hits of a conversation, and (turn, normalised sentence, modifiers) for each client
    sentence (the sentences the embedding head reads)."""
    hits, sentences = [], []
    for t, (question, turn) in enumerate(client_turns(history)):
        norm = R.normalize(turn)
        asked = _asked(question)
        if asked and _YES.search(norm):
            level = "elevated" if _SOFT_YES.search(norm) else "high"
            hits.append(Hit(asked, level, "answer_to_question", t, f"{question[-60:]} {norm[:40]}"))
        turn_resolved, denied, stopped = R.resolved(norm), R.denial(norm), R.stopped(norm)
        for s in R.split_sentences(norm):
            found, lowered = sentence_hits(s, turn_resolved)
            if denied:  # "I've thought about killing myself, but I'd never go through with it"
                found = tuple(_lower(h, "denied") if h.name in DENIABLE and h.level == "high" else h for h in found)
            if stopped:  # "I had the razor in my hand but I put it down and called my friend"
                found = tuple(_lower(h, "stopped") if h.name in STOPPABLE and h.level == "high" else h for h in found)
            hits += [dataclasses.replace(h, turn=t) for h in found]
            if asked and any(h.name in ("means", "plan", "timing", "weapon", "act") for h in found):
                hits.append(Hit(asked, "high", "answer_to_question", t, f"{question[-60:]} {s[:40]}"))
            sentences.append((t, s, lowered | R.head_caps(s, norm)))
    hits += _combos(hits)
    return hits, sentences


def with_conversation(a: RiskAssessment, p: np.ndarray, sc, best: np.ndarray | None = None) -> RiskAssessment:
    """Layer 5 over the level of layers 1-4 (``a``), given the conversation head's [6] probabilities
    (not high, then CATEGORIES) for the whole conversation, the ``safety`` config section, and the
    probabilities of its prefix with the highest P(high) (default ``p``). That prefix decides whether
    1-4's high is confirmed, so a later turn cannot talk an earlier risk away (averaged over the
    whole conversation, a few odd words at the end took a stated overdose plan from P 0.84 to 0.00)."""
    p_high, cat = float(1.0 - p[0]), CATEGORIES[int(np.argmax(p[1:]))]
    best_high = p_high if best is None else float(1.0 - best[0])
    why = f"conversation head p={p_high:.2f} ({cat})" + (f", {best_high:.2f} up to an earlier client turn"
                                                         if best_high > p_high + 0.005 else "")
    if a.level == "high" and (a.firm or best_high >= sc.conv_confirm):
        return RiskAssessment("high", a.categories, a.reasons + [why])
    if p_high >= sc.conv_high:
        return RiskAssessment("high", [cat], [why] + a.reasons)
    if a.level == "high":
        return RiskAssessment("elevated", a.categories, [f"{why}: below {sc.conv_confirm}, the high findings "
                                                         f"below count as elevated"] + a.reasons)
    if p_high >= sc.conv_elevated:
        return RiskAssessment("elevated", a.categories if a.level == "elevated" else [cat], a.reasons + [why])
    return a


def with_answer(history: list[dict], answer: str) -> list[dict]:
    """The conversation followed by the counselor's answer, for the risk metric of rollouts and
    evaluation answers. The check reads client turns only, so the answer goes in as one more turn:
    its own words are checked too (a reply that names a method reads as high)."""
    return [*history, {"role": "user", "content": answer}]


def level_counts(assessments: list[RiskAssessment]) -> dict:
    """Count and fraction of high and elevated assessments: ``{"n", "high", "elevated", "high_frac",
    "elevated_frac"}``."""
    n = len(assessments)
    high = sum(a.level == "high" for a in assessments)
    elevated = sum(a.level == "elevated" for a in assessments)
    return {"n": n, "high": high, "elevated": elevated,
            "high_frac": high / n if n else 0.0, "elevated_frac": elevated / n if n else 0.0}


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


# ------------------------------------------------------------------------------ the classifier


def _inline(fn, *args):
    return fn(*args)


class RiskClassifier:
    """``RiskClassifier.from_config(cfg)`` once per process, then ``assess(history)``."""

    def __init__(self, cfg, embedder=None, head: EmbeddingHead | None = None, run=None,
                 backbone: Backbone | None = None, conv: ConversationHead | None = None):
        """``run(fn, *args)``: where the models' torch work runs (default: the calling thread); a
        process that hosts a transformers engine passes ``engine.call`` (one OpenMP pool,
        ``rollout/hf_engine.py``)."""
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
            backbone = run(Backbone, sc.backbone, sc.conv_layers, sc.conv_batch, sc.conv_device)
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
        reads = [[h[:j + 1] for j, m in enumerate(h) if m.get("role") == "user"] + [h] for h in histories]
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
            probs = self._conv_probs([self._window(h) for h in histories])
            out = [with_conversation(a, whole, self.cfg, best) for a, (whole, best) in zip(out, probs)]
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
    from escrag.models import _build_once

    shipped = HEADS_DIR / f"{name}.npz"
    if shipped.is_file():
        return shipped
    return _build_once(name, lambda tmp: np.savez(tmp / "head.npz", **fit())) / "head.npz"


def fit_heads_main(args) -> int:
    """``escrag safety fit-heads [--config FILE]``: fit the config's two heads anew (no cache) and write
    them to data/safety/heads/, replacing the heads shipped before."""
    from escrag.atomic import atomic_file
    from escrag.config import load_config
    from escrag.embed import load_embedder
    from escrag.safety_conv import conv_head_key, fit_conv_arrays

    sc = load_config(args.config, args.override).safety
    tuning = resolve_cases(sc.tuning)
    heads = {f"safety-head-{head_key(sc, tuning)}": fit_head_arrays(sc, tuning, load_embedder(sc.embedder)),
             f"safety-conv-{conv_head_key(sc)}": fit_conv_arrays(sc, Backbone(sc.backbone, sc.conv_layers,
                                                                              sc.conv_batch, sc.conv_device))}
    HEADS_DIR.mkdir(parents=True, exist_ok=True)
    for name, arrays in heads.items():
        with atomic_file(HEADS_DIR / f"{name}.npz", "wb", encoding=None) as f:
            np.savez(f, **arrays)
        print(f"wrote {HEADS_DIR / name}.npz")
    for old in set(HEADS_DIR.glob("*.npz")) - {HEADS_DIR / f"{n}.npz" for n in heads}:
        old.unlink()
        print(f"removed {old}")
    return 0


# ------------------------------------------------------------------------------ the reply

HELP = {  # locale -> (crisis line, emergency number, abuse line, poison line)
    "international": ("a local crisis line (findahelpline.com lists free, confidential lines in most countries)",
                      "your local emergency services (112 from any mobile phone in many countries, 911 in North "
                      "America, 999 in the UK, 000 in Australia)",
                      "a local domestic-violence helpline (findahelpline.com lists them)",
                      "a poison control centre"),
    "us": ("the 988 Suicide & Crisis Lifeline (call or text 988)", "911",
           "the National Domestic Violence Hotline (1-800-799-7233, or text START to 88788)",
           "Poison Control (1-800-222-1222)"),
    "uk": ("Samaritans (call 116 123, free, day or night) or text SHOUT to 85258", "999",
           "the National Domestic Abuse Helpline (0808 2000 247)", "NHS 111"),
    "ie": ("Samaritans (call 116 123) or text HELLO to 50808", "112 or 999",
           "Women's Aid (1800 341 900)", "the Poisons Information Centre (01 809 2166)"),
    "ca": ("the 9-8-8 Suicide Crisis Helpline (call or text 988)", "911",
           "a local shelter or crisis line (211 can connect you)", "your provincial poison centre"),
    "au": ("Lifeline (13 11 14, or text 0477 13 11 14)", "000", "1800RESPECT (1800 737 737)",
           "the Poisons Information Centre (13 11 26)"),
    "eu": ("a crisis line (116 123 in many EU countries)", "112",
           "a domestic-violence helpline (116 016 in many EU countries)", "a poison control centre"),
}

OPENING = {
    "suicide": "I'm really glad you told me this, and I'm worried about your safety right now. You don't "
               "have to carry this alone.",
    "self_harm": "Thank you for telling me. I'm concerned about how badly you may be hurt, and you deserve "
                 "care right now.",
    "harm_to_others": "I can hear how much anger and pain you're holding. I'm worried someone could get hurt, "
                      "including you.",
    "abuse": "I'm so sorry this is happening. What you're describing is dangerous, and it is not your fault.",
    "medical": "I'm worried about you. What you're describing can be a medical emergency.",
}


def help_lines(categories: list[str], sc) -> str:
    """Where to get help now, for the categories found, in ``sc.locale`` (or ``sc.help_text``)."""
    if sc.help_text:
        return sc.help_text
    crisis, emergency, abuse, poison = HELP[sc.locale]
    cats = set(categories) or {"suicide"}
    lines = []
    if cats & {"medical", "self_harm"} or "suicide" in cats:
        lines.append(f"If you are in danger or have already hurt yourself or taken something, please call "
                     f"{emergency} now" + (f" or {poison}" if "medical" in cats else "") + ".")
    if cats & {"suicide", "self_harm"}:
        lines.append(f"You can also reach {crisis} right now; they are there to listen.")
    if "abuse" in cats:
        lines.append(f"If you are in danger, please call {emergency} now, and when it is safe, {abuse} can help "
                     f"you plan what to do next.")
    if "harm_to_others" in cats:
        lines.append(f"Please put some distance between you and that person and anything you could use, and call "
                     f"{emergency} or {crisis} now.")
    return " ".join(lines)


def safety_reply(reply: str, assessment: RiskAssessment, sc) -> str:
    """At high risk: a supportive opening, where to get help now in the configured locale, and an
    invitation to keep talking (the policy's own text stays in ``escrag.output``). Otherwise ``reply``."""
    if assessment.level != "high":
        return reply
    cats = assessment.categories or ["suicide"]
    opening = OPENING[cats[0]]
    return f"{opening} {help_lines(cats, sc)} I'm here with you, and we can keep talking while you reach out."
