"""Rule scorers that a reward server can serve in place of the reward model (``--rule NAME[:ARG]``).

Owns: the registry ``RULES`` and ``parse_rule``. A rule is a plain function
``(history, response_text) -> float``; the server passes it the response text (the ``<response>``
block when the format parses, else the whole output), or the whole output to a rule marked
``reads_output``, and adds the format reward, exactly as for the RM.
They make learning tests possible with a known optimum; they are not part of the paper.

- ``keyword:WORD``: fraction of the whitespace-separated words of the response equal to WORD,
  case-insensitive, after stripping punctuation around each word ("Hello," counts as "hello").
- ``length:N``: ``max(0, 1 - |words - N| / N)``, 1 at exactly N words.
- ``vowels``: share of vowels (aeiou) among the letters of the response, 0 without letters; a dense
  signal that even a tiny random model can climb (tests/test_learner_learns.py).
- ``strategy:SPLIT`` (default ``train``): ESConv's human labels as the reward (issue 53,
  experiments/strategy_claim/): 1 when the output's ``<think>`` block names exactly one ESConv strategy
  and it is among the gold counselor turn's labels of the state of SPLIT whose history this is
  (``escrag.data.strategy_hit``). It reads the whole output (``reads_output``), not the response. A
  history that is no state of SPLIT fails its ``check`` (``UserError``, HTTP 400), run on each request
  before it joins a batch, so it fails alone. Several states with one history (short openings) pool
  their labels.

To add a rule: write ``make_<name>(arg: str | None) -> Rule`` and list it in ``RULES``; code outside the
library (``experiments/``) calls ``register`` instead (the mechanism task's ``mechanism:WORLD[/TRAIN]``).
"""

from __future__ import annotations

import json
import string
from collections.abc import Callable

from escrag.errors import UserError

Rule = Callable[[list[dict], str], float]


def _words(text: str) -> list[str]:
    return text.split()


def make_keyword(arg: str | None) -> Rule:
    if not arg or not arg.strip() or len(arg.split()) != 1:
        raise UserError(f"keyword rule needs one word, as in keyword:hello (got {arg!r})")
    word = arg.strip().lower()

    def keyword(history: list[dict], text: str) -> float:
        words = _words(text)
        if not words:
            return 0.0
        return sum(w.strip(string.punctuation).lower() == word for w in words) / len(words)

    return keyword


def make_length(arg: str | None) -> Rule:
    try:
        n = int(arg or "")
    except ValueError:
        n = 0
    if n < 1:
        raise UserError(f"length rule needs a positive word count, as in length:20 (got {arg!r})")

    def length(history: list[dict], text: str) -> float:
        return max(0.0, 1.0 - abs(len(_words(text)) - n) / n)

    return length


def make_vowels(arg: str | None) -> Rule:
    if arg:
        raise UserError(f"vowels rule takes no argument (got {arg!r})")

    def vowels(history: list[dict], text: str) -> float:
        letters = [c for c in text.lower() if c.isalpha()]
        return sum(c in "aeiou" for c in letters) / len(letters) if letters else 0.0

    return vowels


def history_key(history: list[dict]) -> str:
    return json.dumps([[m["role"], m["content"]] for m in history], ensure_ascii=False)


def make_strategy(arg: str | None) -> Rule:
    from escrag.data import load_states, strategy_hit
    from escrag.formats import parse_output

    split = arg or "train"
    gold: dict[str, set[str]] = {}
    for s in load_states(split):
        gold.setdefault(history_key(s.history), set()).update(s.strategies)

    def check(history: list[dict]) -> None:
        if history_key(history) not in gold:
            raise UserError(f"strategy:{split}: the history is no dialogue state of ESConv {split!r} "
                            f"(its last turn: {history[-1]['content'][:80]!r})" if history else
                            f"strategy:{split}: empty history")

    def strategy(history: list[dict], output: str) -> float:
        return strategy_hit(parse_output(output).think, tuple(gold[history_key(history)]))

    strategy.reads_output, strategy.check = True, check
    return strategy


RULES: dict[str, Callable[[str | None], Rule]] = {"keyword": make_keyword, "length": make_length,
                                                  "vowels": make_vowels, "strategy": make_strategy}


def register(name: str, make: Callable[[str | None], Rule]) -> None:
    """Add a rule from outside the library (an experiment registers its own when imported)."""
    RULES[name] = make


def parse_rule(spec: str) -> Rule:
    """``NAME[:ARG]`` -> the rule function; an unknown name or a bad argument raises ``UserError``."""
    name, _, arg = spec.partition(":")
    if name not in RULES:
        raise UserError(f"--rule {spec}: unknown rule {name!r} (known: {', '.join(sorted(RULES))})")
    return RULES[name](arg or None)
