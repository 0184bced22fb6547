"""ESConv loading and dialogue states (paper 3.1).

Owns: reading ESConv-format JSONL (the bundled copy in ``data/esconv/`` or any path), validating each
record with an error naming file and line, merging consecutive utterances of one speaker into one
turn, and turning each dialogue into dialogue states H_i -> c_i.

Departures from the paper: the paper writes a dialogue as strictly alternating u_1, c_1, ...; ESConv
has runs of several utterances by one speaker, which we join with a single space into one turn. A
counselor turn that opens a dialogue (no client turn before it) yields no state, since H_i must end in
a client turn. Roles follow OpenAI: ``user`` = client (``usr``), ``assistant`` = counselor (``sys``).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from escrag.errors import UserError

SPLITS = ("train", "valid", "test")
DATA_DIR = Path(__file__).resolve().parent.parent / "data" / "esconv"
ROLE_OF_SPEAKER = {"usr": "user", "sys": "assistant"}
STRATEGIES = ("Question", "Restatement or Paraphrasing", "Reflection of feelings", "Self-disclosure",
              "Affirmation and Reassurance", "Providing Suggestions", "Information", "Others")  # ESConv's 8

_NAMED = re.compile("|".join(re.escape(s) for s in sorted(STRATEGIES, key=len, reverse=True)), re.IGNORECASE)
_CANON = {s.lower(): s for s in STRATEGIES}


def named_strategies(text: str) -> list[str]:
    """The distinct ESConv strategies ``text`` names (canonical spelling, case-insensitive), in order."""
    return list(dict.fromkeys(_CANON[m.group(0).lower()] for m in _NAMED.finditer(text or "")))


def strategy_hit(think: str, gold: tuple[str, ...] | list[str]) -> float:
    """The strategy reward (issue 53): 1.0 when ``think`` names exactly one ESConv strategy and it is
    one of the gold turn's labels ``gold``, else 0.0. Naming several earns nothing, so it cannot be
    gamed by listing."""
    named = named_strategies(think)
    return float(len(named) == 1 and named[0] in gold)


class DataError(UserError):
    """A data file is malformed; the message names the file and line."""


@dataclass(frozen=True)
class Turn:
    role: str  # "user" (client) or "assistant" (counselor)
    content: str
    strategies: tuple[str, ...] = ()  # counselor strategies of the merged utterances, in order, unique


@dataclass(frozen=True)
class Dialogue:
    dialogue_id: str  # "<split-or-file-stem>-<line number>"
    turns: tuple[Turn, ...]
    situation: str
    emotion: str
    problem: str


@dataclass(frozen=True)
class DialogueState:
    """H_i (history ending in a client turn) and the gold counselor turn c_i that follows."""

    dialogue_id: str
    turn_index: int  # index of the target turn within the merged dialogue
    history: list[dict] = field(hash=False)  # [{"role", "content"}], last one is role "user"
    target: str = ""
    strategies: tuple[str, ...] = ()
    situation: str = ""
    emotion: str = ""
    problem: str = ""

    @property
    def state_id(self) -> str:
        """``<dialogue_id>/<turn_index>``: unique within a data set; what every record is keyed by."""
        return f"{self.dialogue_id}/{self.turn_index}"


def resolve_path(split_or_path: str | Path) -> Path:
    """``train``/``valid``/``test`` name the bundled split; anything else is a file path."""
    if str(split_or_path) in SPLITS:
        return DATA_DIR / f"{split_or_path}.jsonl"
    path = Path(split_or_path)
    if not path.is_file():
        raise DataError(f"{path}: no such ESConv file (or use one of the splits {', '.join(SPLITS)})")
    return path


def _require(cond: bool, where: str, what: str) -> None:
    if not cond:
        raise DataError(f"{where}: {what}")


def _parse_record(obj: object, where: str) -> tuple[list[tuple[str, str, str | None]], dict]:
    _require(isinstance(obj, dict), where, "record is not a JSON object")
    dialog = obj.get("dialog")
    _require(isinstance(dialog, list) and dialog, where, "field 'dialog' must be a non-empty list")
    utterances = []
    for j, utt in enumerate(dialog):
        at = f"{where}: dialog[{j}]"
        _require(isinstance(utt, dict), at, "utterance is not an object")
        _require(utt.get("speaker") in ROLE_OF_SPEAKER, at, "'speaker' must be 'usr' or 'sys'")
        text = utt.get("text")
        _require(isinstance(text, str), at, "'text' must be a string")
        strategy = utt.get("strategy")
        _require(strategy is None or isinstance(strategy, str), at, "'strategy' must be a string")
        utterances.append((utt["speaker"], text.strip(), strategy))
    meta = {}
    for key in ("situation", "emotion_type", "problem_type"):
        val = obj.get(key, "")
        _require(isinstance(val, str), where, f"field '{key}' must be a string")
        meta[key] = val.strip()
    return utterances, meta


def merge_turns(utterances: list[tuple[str, str, str | None]]) -> tuple[Turn, ...]:
    """Join runs of one speaker into one turn; empty utterances are dropped."""
    turns: list[Turn] = []
    for speaker, text, strategy in utterances:
        if not text:
            continue
        role = ROLE_OF_SPEAKER[speaker]
        strategies = (strategy,) if strategy and role == "assistant" else ()
        if turns and turns[-1].role == role:
            prev = turns[-1]
            merged = prev.strategies + tuple(s for s in strategies if s not in prev.strategies)
            turns[-1] = Turn(role, f"{prev.content} {text}", merged)
        else:
            turns.append(Turn(role, text, strategies))
    return tuple(turns)


def read_jsonl(path: str | Path, what: str, error: type[Exception] = DataError) -> Iterator[tuple[str, int, object]]:
    """(``file:line``, line number, parsed object) for each non-blank line of a JSONL file; a missing
    file (named as ``what``) or a line that is not JSON raises ``error`` naming file and line."""
    path = Path(path)
    if not path.is_file():
        raise error(f"{path}: no such {what}")
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise error(f"{where}: invalid JSON ({exc.msg} at column {exc.colno})") from None
            yield where, lineno, obj


def load_dialogues(split_or_path: str | Path = "train") -> list[Dialogue]:
    path = resolve_path(split_or_path)
    stem = str(split_or_path) if str(split_or_path) in SPLITS else path.stem
    dialogues = []
    for where, lineno, obj in read_jsonl(path, "ESConv file"):
        utterances, meta = _parse_record(obj, where)
        dialogues.append(Dialogue(f"{stem}-{lineno}", merge_turns(utterances), meta["situation"],
                                  meta["emotion_type"], meta["problem_type"]))
    if not dialogues:
        raise DataError(f"{path}: no dialogues")
    return dialogues


def load_surveys(split_or_path: str | Path = "test") -> dict[str, dict[str, int]]:
    """dialogue id -> the seeker's survey (``empathy``, ``relevance``, ``initial_emotion_intensity``,
    ``final_emotion_intensity``, each 1-5) for the dialogues whose survey has all four as integers."""
    path = resolve_path(split_or_path)
    stem = str(split_or_path) if str(split_or_path) in SPLITS else path.stem
    keys = ("empathy", "relevance", "initial_emotion_intensity", "final_emotion_intensity")
    out = {}
    for _, lineno, obj in read_jsonl(path, "ESConv file"):
        seeker = ((obj.get("survey_score") or {}).get("seeker") or {}) if isinstance(obj, dict) else {}
        vals = [str(seeker.get(k, "")).strip() for k in keys]
        if all(v.isdigit() for v in vals):
            out[f"{stem}-{lineno}"] = dict(zip(keys, map(int, vals)))
    return out


def dialogue_states(d: Dialogue) -> Iterator[DialogueState]:
    """One state per counselor turn that follows a client turn."""
    for i, turn in enumerate(d.turns):
        if turn.role != "assistant" or i == 0 or d.turns[i - 1].role != "user":
            continue
        history = [{"role": t.role, "content": t.content} for t in d.turns[:i]]
        yield DialogueState(d.dialogue_id, i, history, turn.content, turn.strategies,
                            d.situation, d.emotion, d.problem)


def load_states(split_or_path: str | Path = "train") -> list[DialogueState]:
    return [s for d in load_dialogues(split_or_path) for s in dialogue_states(d)]


def split_stats(split_or_path: str | Path) -> dict:
    dialogues = load_dialogues(split_or_path)
    states = [s for d in dialogues for s in dialogue_states(d)]
    strategies = Counter(s for st in states for s in st.strategies)
    return {
        "dialogues": len(dialogues),
        "states": len(states),
        "mean_turns": sum(len(d.turns) for d in dialogues) / len(dialogues),
        "strategies": dict(strategies.most_common()),
    }
