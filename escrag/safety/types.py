"""The crisis check's vocabulary of results: levels, categories, ``RiskAssessment``, ``Hit``, and the
metric helpers over assessments (``with_answer``, ``level_counts``) and heads (``softmax``)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

LEVELS = ("none", "elevated", "high")
CATEGORIES = ("suicide", "self_harm", "harm_to_others", "abuse", "medical")


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




def softmax(z: np.ndarray) -> np.ndarray:
    """Row-wise softmax of [n, classes] logits (both heads' probabilities)."""
    z = np.exp(z - z.max(axis=1, keepdims=True))
    return z / z.sum(axis=1, keepdims=True)
