"""The rules over a conversation: every client turn's sentences, answers to the counselor's risk
question, and combinations of cues across turns (``rule_hits``; layers 1-3 of ``escrag.safety``)."""

from __future__ import annotations

import dataclasses
import re
from functools import lru_cache

from escrag.safety import rules as R
from escrag.safety.lexicon import clause_span, normalize, split_sentences
from escrag.safety.types import Hit


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
            a, b = clause_span(sentence, m.start())
            c, d = clause_span(sentence, max(m.start(), m.end() - 1))
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
    q = normalize(question)
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
        norm = normalize(turn)
        asked = _asked(question)
        if asked and _YES.search(norm):
            level = "elevated" if _SOFT_YES.search(norm) else "high"
            hits.append(Hit(asked, level, "answer_to_question", t, f"{question[-60:]} {norm[:40]}"))
        turn_resolved, denied, stopped = R.resolved(norm), R.denial(norm), R.stopped(norm)
        for s in split_sentences(norm):
            found, lowered = sentence_hits(s, turn_resolved)
            if denied:  # "I've thought about killing myself, but I'd never go through with it"
                found = tuple(_lower(h, "denied") if h.name in DENIABLE and h.level == "high" else h for h in found)
            if stopped:  # "I had the razor in my hand but I put it down and called my friend"
                found = tuple(_lower(h, "stopped") if h.name in STOPPABLE and h.level == "high" else h for h in found)
            hits += [dataclasses.replace(h, turn=t) for h in found]
            if asked and any(h.name in ("means", "plan", "timing", "weapon", "act") for h in found):
                hits.append(Hit(asked, "high", "answer_to_question", t, f"{question[-60:]} {s[:40]}"))
            sentences.append((t, s, lowered | R.head_caps(s, denied)))
    hits += _combos(hits)
    return hits, sentences
