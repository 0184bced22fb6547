"""Risk check of the client's latest turns before a counselor reply goes out.

Owns: ``RiskClassifier`` (lexicon + embedding similarity to seed phrases), ``RiskAssessment`` and the
crisis notice appended to a reply at high risk. Categories: suicide, self-harm, harm to others, abuse.

How it decides, per sentence (and per clause, split at commas and at "but", "because", "so") of the
latest ``rollout.risk_turns`` client turns:
1. Lexicon: explicit phrases ("kill myself", "he hits me", ...) give ``high``; the same phrase under a
   negation ("I would never kill myself") gives ``elevated``: still worth a human's look.
2. Similarity: the sentence is embedded (all-MiniLM-L6-v2 by default) and compared with seed phrases
   of each category and with a benign set (ordinary sadness, stress and idioms such as "this job is
   killing me"). A category counts when its best cosine passes ``risk_high_similarity`` (high) or
   ``risk_elevated_similarity`` (elevated) AND beats the best benign cosine by ``risk_benign_margin``;
   pieces under ``MIN_WORDS`` words skip this step.
The level of the conversation is the highest level found; ``reasons`` says which rule fired on what.

This is a screening aid, not a clinical instrument: it errs towards flagging, flags go to a human
(the ``escrag.risk`` field of a counselor reply), and the thresholds are calibrated for MiniLM only.
The paper has no safety layer; this is ours.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

LEVELS = ("none", "elevated", "high")
MIN_WORDS = 4  # sentences and clauses shorter than this only go through the lexicon

SEEDS = {
    "suicide": [
        "I want to kill myself", "I want to end my life", "I am thinking about suicide",
        "I don't want to live anymore", "I wish I was dead", "I want to die",
        "everyone would be better off without me", "I have a plan to end it all",
        "there is no reason for me to keep living", "I'm going to take all my pills tonight",
        "I wrote a goodbye letter to my family", "I won't be around much longer",
        "I want to go to sleep and never wake up", "life is not worth living anymore",
        "I wish I wasn't here anymore", "I just want to disappear forever",
        # warning signs from suicide-prevention guides: burdensomeness, giving things away, goodbyes
        "I feel like a burden to everyone", "I have been giving away my possessions",
        "I've been saying goodbye to people", "nobody would miss me if I was gone",
    ],
    "self_harm": [
        "I cut myself", "I have been hurting myself", "I burn my skin to feel something",
        "I hit myself when I get upset", "I started cutting again", "I want to hurt myself",
        "I punish myself by injuring my body", "I scratch my arms until they bleed",
    ],
    "harm_to_others": [
        "I want to kill him", "I am going to hurt someone", "I want to make them pay with blood",
        "I'm going to beat him up", "I have thought about killing my boss",
        "I could shoot everyone at work", "I want to hurt my child", "I will get a gun and go there",
        "I fantasize about hurting people", "I want to attack someone with a knife",
        "I think about killing people",
    ],
    "abuse": [
        "my husband hits me", "my partner beats me", "he threatens to kill me",
        "my father abuses me", "I was sexually assaulted", "she hurts me when she is angry",
        "I am afraid he will hurt me again", "my boyfriend forces me to have sex",
        "my parents hit me and lock me in my room", "he chokes me during fights",
    ],
}

BENIGN = [
    "I feel sad today", "I am so stressed about my exams", "I broke up with my girlfriend and I miss her",
    "I lost my job and I feel awful", "I feel lonely since I moved to a new city",
    "this job is killing me", "my feet are killing me", "I'm dying to see that movie",
    "I could kill for a cup of coffee", "I am tired of arguing with my sister", "I cried all night",
    "my dog died last week and I am heartbroken", "I feel like a failure at work",
    "I am worried about paying my bills", "my friends ignore me", "I can't sleep because of anxiety",
    "I am so angry at my boss", "I don't want to hurt her feelings", "the pandemic makes me depressed",
    "I feel hopeless about finding a job", "I hate my job", "my mom is sick and I am scared",
    "my brother beat me at video games", "she beat me in the race",
    # everyday conversation, so that short neutral lines do not drift towards a risk seed
    "thank you so much, have a nice day, bye", "I'm doing ok, how about you?", "I would like to try that",
    "I love my job", "I will ask her out for coffee", "what if she gets mad at me?",
    "I wish I could spend more time outside", "I am taking medication for my depression",
    "I will try to be less available", "we have little kids at home", "I am very hurt by what he said",
]

_NEG = r"(?:never|not|n't|no way|wouldn't|won't|don't|do not)"
_PERSON = (r"(he|she|they|husband|wife|partner|boyfriend|girlfriend|dad|father|mom|mother|parents?|"
           r"stepdad|stepfather|stepmom|stepmother|brother|sister|uncle|aunt|teacher|boss|ex)")
_LEXICON = [  # (category, pattern); matches give "high" unless negated just before
    ("suicide", r"\b(kill|killing|hang|hanging|shoot|shooting) myself\b"),
    ("suicide", r"\bsuicid(e|al)\b"),
    ("suicide", r"\b(end|ending|take|taking) (my|my own) life\b"),
    ("suicide", r"\b(want|wanna|wanted|going|ready) to die\b"),
    ("suicide", r"\bend it all\b"),
    ("suicide", r"\b(better off|be better) (dead|without me)\b"),
    ("suicide", r"\boverdos(e|ing)\b"),
    ("self_harm", r"\b(cut|cutting|burn|burning|hurt|hurting|harm|harming|injure|injuring) myself\b"),
    ("self_harm", r"\bself[- ]harm"),
    ("harm_to_others", r"\b(kill|murder|shoot|stab|strangle|choke) (him|her|them|someone|somebody|people|everyone|my \w+)\b"),
    ("harm_to_others", r"\bhurt (him|them|someone|somebody|people|everyone)\b"),
    ("abuse", rf"\b{_PERSON}\b(\W+\w+){{0,2}}\W+(hits|hit|beats|beat|slaps|slapped|punches|punched|chokes|"
              r"choked|kicks|kicked|rapes|raped|molests|molested) me\b(?! (at|in|to|up)\b)"),
    ("abuse", r"\b(abuses|abused|abusing) me\b"),
    ("abuse", r"\b(sexually (abused|assaulted)|domestic (violence|abuse))\b"),
    ("abuse", r"\bthreatens? to (kill|hurt) me\b"),
]
_SENTENCES = re.compile(r"(?<=[.!?;])\s+|\n+")
_CLAUSES = re.compile(r",\s+|\s+(?:but|because|so)\s+")  # long sentences dilute an embedding

CRISIS_NOTICE = {
    "suicide": "Your safety matters most right now. Please contact a crisis line or your local emergency "
               "number now (in the US, call or text 988; in the UK and Ireland, Samaritans at 116 123; "
               "in the EU, 112). If you might act on these thoughts, call emergency services immediately.",
    "harm_to_others": "Please step away from the situation and contact your local emergency number now "
                      "(911 in the US, 112 in the EU, 999 in the UK) or a crisis line (988 in the US) so "
                      "that nobody gets hurt, including you.",
    "abuse": "If you are in danger, please call your local emergency number now (911 in the US, 112 in "
             "the EU, 999 in the UK). A domestic-abuse or crisis line can help you stay safe (in the "
             "US, 1-800-799-7233 or text 988).",
}
CRISIS_NOTICE["self_harm"] = CRISIS_NOTICE["suicide"]


@dataclass
class RiskAssessment:
    level: str = "none"  # one of LEVELS
    reasons: list[str] = field(default_factory=list)  # which rule fired, on which words
    categories: list[str] = field(default_factory=list)  # categories that reached ``level``

    def to_dict(self) -> dict:
        return {"risk": self.level, "reasons": list(self.reasons), "categories": list(self.categories)}


def _raise(a: RiskAssessment, level: str, category: str, reason: str) -> None:
    if LEVELS.index(level) > LEVELS.index(a.level):
        a.level, a.categories = level, []
    if level == a.level and category not in a.categories:
        a.categories.append(category)
    a.reasons.append(reason)


class RiskClassifier:
    def __init__(self, embedder, high: float = 0.6, elevated: float = 0.45, margin: float = 0.1,
                 turns: int = 2):
        self.embedder, self.high, self.elevated = embedder, high, elevated
        self.margin, self.turns = margin, turns
        self._seed_texts = [(c, s) for c, seeds in SEEDS.items() for s in seeds]
        self._seeds = embedder.encode([s for _, s in self._seed_texts])
        self._benign = embedder.encode(BENIGN)
        self._lexicon = [(c, re.compile(p)) for c, p in _LEXICON]

    @classmethod
    def from_config(cls, cfg) -> RiskClassifier:
        from escrag.embed import load_embedder

        ro = cfg.rollout
        return cls(load_embedder(ro.risk_embedder), ro.risk_high_similarity, ro.risk_elevated_similarity,
                   ro.risk_benign_margin, ro.risk_turns)

    def client_sentences(self, history: list[dict]) -> list[str]:
        turns = [m["content"] for m in history if m.get("role") == "user"][-self.turns:]
        sentences = [s.strip() for t in turns for s in _SENTENCES.split(t) if s and s.strip()]
        clauses = [c.strip() for s in sentences for c in _CLAUSES.split(s)]
        extra = [c for c in clauses if c not in sentences]
        return sentences + extra

    def assess(self, history: list[dict]) -> RiskAssessment:
        """Risk of the latest client turns of ``history`` ([{"role", "content"}])."""
        sentences = self.client_sentences(history)
        a = RiskAssessment()
        negated = {i for i, s in enumerate(sentences) if self._lexicon_check(s, a)}
        if sentences:
            self._similarity_check(sentences, a, negated)
        return a

    def _lexicon_check(self, sentence: str, a: RiskAssessment) -> bool:
        """Apply the lexicon; True when a risk phrase occurred under a negation."""
        low, any_negated = sentence.lower().replace("’", "'"), False
        for category, pat in self._lexicon:
            m = pat.search(low)
            if m is None:
                continue
            negated = re.search(rf"\b{_NEG}\b(\W+\w+){{0,3}}\W*$", low[:m.start()]) is not None
            any_negated |= negated
            _raise(a, "elevated" if negated else "high", category,
                   f"lexicon{' (negated)' if negated else ''}: '{m.group(0)}' ({category})")
        return any_negated

    def _similarity_check(self, sentences: list[str], a: RiskAssessment, negated: set[int]) -> None:
        """Sentences with a negated lexicon hit reach at most "elevated" here too."""
        vecs = self.embedder.encode(sentences)
        sims = vecs @ self._seeds.T  # [S, seeds]
        benign = (vecs @ self._benign.T).max(axis=1)  # [S]
        for i, sentence in enumerate(sentences):
            if len(sentence.split()) < MIN_WORDS:  # "Bye!" is too short to embed meaningfully
                continue
            j = int(np.argmax(sims[i]))
            best = float(sims[i, j])
            if best < self.elevated or best < benign[i] + self.margin:
                continue
            category, seed = self._seed_texts[j]
            level = "high" if best >= self.high and i not in negated else "elevated"
            _raise(a, level, category, f"similar to '{seed}' ({category}, cosine {best:.2f}): "
                                       f"'{sentence[:120]}'")


def crisis_notice(assessment: RiskAssessment) -> str:
    """The lines a high-risk reply must end with, one per category found (deduplicated)."""
    notes = []
    for c in assessment.categories or ["suicide"]:
        if CRISIS_NOTICE[c] not in notes:
            notes.append(CRISIS_NOTICE[c])
    return " ".join(notes)


def apply_safety(reply: str, assessment: RiskAssessment) -> str:
    """At high risk, keep the reply's empathy and append a clear call to get help now."""
    if assessment.level != "high":
        return reply
    opener = "I'm really glad you told me this, and I'm concerned about your safety."
    body = reply.strip() or opener
    return f"{body}\n\n{crisis_notice(assessment)}"
