"""ESC-Preference pairs: the JSONL schema, a validating loader, an atomic writer, and silver pairs.

Owns: ``PreferencePair`` and its file format (shared by the reward-model trainer and the retrieval
corpus, hence in the core), and ``escrag prefs bootstrap``.

One JSON object per line::

    {"id": "silver-train-12-5",                      # unique within the file
     "history": [{"role": "user", "content": "..."},  # OpenAI messages, roles user/assistant,
                 {"role": "assistant", "content": "..."}, ..., {"role": "user", ...}],  # ends in user
     "chosen": "the preferred counselor reply",      # non-empty, differs from rejected
     "rejected": "the dispreferred counselor reply",
     "metrics": {"chosen":   {"EI": 8, "NE": 7, "TA": 8, "SC": 7, "TH": 6, "SF": 8, "PT": 7},
                 "rejected": {"EI": 4, ...}},        # optional: all seven scores per side, numbers
     "provenance": {"source": "...", ...}}           # optional JSON object (where the pair came from)

Departure from the paper (said plainly): the paper's ESC-Preference pairs come from a simulated-client,
three-model, seven-metric pipeline (section 3.2). Until that data exists, ``bootstrap_pairs`` makes
*silver* pairs from ESConv train only, as a stand-in: chosen = the gold counselor turn, rejected = a
seeded negative of one of the kinds of ``NEGATIVE_KINDS`` (a counselor turn from another dialogue, from
another dialogue about the same problem type, from the same dialogue several turns away, a generic
reply, a premature-advice / lecturing turn, or the gold turn cut off mid-sentence); the mix and the
pairs per state are ``reward.silver_negatives`` / ``reward.silver_per_state``. States whose gold turn
has fewer than ``MIN_GOLD_WORDS`` words (greetings, "ok") are skipped: the gold is not clearly better
there. Silver pairs carry no metric scores.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from escrag.atomic import atomic_file
from escrag.data import SPLITS, DataError, load_states, read_jsonl
from escrag.errors import UserError

METRICS = ("EI", "NE", "TA", "SC", "TH", "SF", "PT")  # paper 3.2: Client EI NE TA, Counselor SC TH, Judge SF PT
METRIC_NAMES = {"EI": "Emotional Impact", "NE": "Non-Lecturing Empathy", "TA": "Therapeutic Alliance",
                "SC": "Strategic Coherence", "TH": "Theoretical Application", "SF": "Strategy-Client Fit",
                "PT": "Problem Targeting"}
PERSPECTIVES = {"Client": ("EI", "NE", "TA"), "Counselor": ("SC", "TH"), "Judge": ("SF", "PT")}  # Table 1
ROLES = ("user", "assistant")
MIN_GOLD_WORDS = 5
# other_dialogue: a counselor turn of another dialogue; same_problem: of another dialogue about the same
# problem type (fluent and on topic, but about someone else); same_dialogue: of the same dialogue, at least
# OFF_CONTEXT_TURNS turns away (this client, the wrong moment); generic; lecturing; truncated
NEGATIVE_KINDS = ("other_dialogue", "same_problem", "same_dialogue", "generic", "lecturing", "truncated")
OFF_CONTEXT_TURNS = 4
DEFAULT_NEGATIVES = ("other_dialogue", "generic", "lecturing", "truncated")  # reward.silver_negatives' default

# Generic replies that ignore what the client said: openers, bare acknowledgements, platitudes. The reward
# is checked on another list (experiments/reward_recipe/generic_eval.txt); the two share no reply.
GENERIC_REASSURANCES = (
    "Don't worry, everything will be fine.",
    "I'm sure it will all work out in the end.",
    "Stay positive! Everything happens for a reason.",
    "Cheer up, tomorrow is another day.",
    "That's life. You'll get over it soon.",
    "Just try not to think about it too much and you'll be okay.",
    "I understand. Things will get better, they always do.",
    "Try to look on the bright side, it could be worse.",
    "Hey! How's your day been so far?",
    "Good morning, how is everything going?",
    "Hi, nice to meet you. What brings you here today?",
    "Okay.",
    "I get it.",
    "Right, that makes sense.",
    "Oh no, that's too bad.",
    "That is really tough.",
    "Sorry about that.",
    "I know exactly how you feel.",
    "Time heals all wounds.",
    "Hang in there, you've got this!",
    "Keep your chin up.",
    "Please go on.",
    "Thanks for telling me.",
    "I hear you.",
)
LECTURES = (  # premature advice / lecturing, without engaging with what the client said
    "You need to stop dwelling on this {problem} and take action. Make a plan today, exercise every "
    "morning and stop feeling sorry for yourself.",
    "The solution to {problem} is simple: set clear goals, stick to a routine and cut out negative "
    "people. You just have to be more disciplined.",
    "Honestly, you should have seen this coming. Next time think ahead and you will not end up in "
    "this situation.",
    "Here is what you must do: write down three steps, do them tomorrow, and stop overthinking. "
    "Worrying never solved anything.",
    "Many people have it much worse than you. You should be grateful and just move on from this "
    "{problem}.",
    "You are making this a bigger deal than it is. Be more positive and it will sort itself out.",
)


@dataclass
class PreferencePair:
    id: str
    history: list[dict]  # [{"role": "user"|"assistant", "content": str}], last role "user"
    chosen: str  # preferred counselor reply c+
    rejected: str  # dispreferred counselor reply c-
    metrics: dict | None = None  # {"chosen": {EI..PT: float}, "rejected": {...}} or None
    provenance: dict = field(default_factory=dict)

    @property
    def group(self) -> str:
        """Pairs of one dialogue share a group, so a held-out split never leaks a dialogue."""
        return str(self.provenance.get("dialogue_id", self.id))

    def to_json(self) -> dict:
        out = asdict(self)
        if out["metrics"] is None:
            del out["metrics"]
        return out


# --------------------------------------------------------------------------- validation


def _check(cond: bool, where: str, what: str) -> None:
    if not cond:
        raise DataError(f"{where}: {what}")


def _check_history(history, where: str) -> list[dict]:
    _check(isinstance(history, list) and history, where, "'history' must be a non-empty list of messages")
    for j, m in enumerate(history):
        at = f"{where}: history[{j}]"
        _check(isinstance(m, dict), at, "message must be an object with 'role' and 'content'")
        _check(m.get("role") in ROLES, at, f"'role' must be one of {list(ROLES)}, got {m.get('role')!r}")
        _check(isinstance(m.get("content"), str), at, "'content' must be a string")
    _check(history[-1]["role"] == "user", where, "'history' must end with a user (client) turn")
    return [{"role": m["role"], "content": m["content"]} for m in history]


def _check_metrics(metrics, where: str) -> dict | None:
    if metrics is None:
        return None
    _check(isinstance(metrics, dict) and set(metrics) == {"chosen", "rejected"}, where,
           "'metrics' must be an object with exactly the keys 'chosen' and 'rejected'")
    for side in ("chosen", "rejected"):
        scores = metrics[side]
        _check(isinstance(scores, dict) and set(scores) == set(METRICS), where,
               f"'metrics.{side}' must have exactly the keys {', '.join(METRICS)}")
        for k, v in scores.items():
            _check(isinstance(v, (int, float)) and not isinstance(v, bool), where,
                   f"'metrics.{side}.{k}' must be a number, got {v!r}")
    return {side: {k: float(metrics[side][k]) for k in METRICS} for side in ("chosen", "rejected")}


def parse_pair(obj, where: str) -> PreferencePair:
    """Validate one decoded JSON record; errors start with ``where`` (file:line)."""
    _check(isinstance(obj, dict), where, "record is not a JSON object")
    known = {"id", "history", "chosen", "rejected", "metrics", "provenance"}
    unknown = sorted(set(obj) - known)
    if unknown:
        raise DataError(f"{where}: unknown field {unknown[0]!r} (known: {', '.join(sorted(known))})")
    _check(isinstance(obj.get("id"), str) and obj["id"].strip(), where, "'id' must be a non-empty string")
    history = _check_history(obj.get("history"), where)
    for side in ("chosen", "rejected"):
        _check(isinstance(obj.get(side), str) and obj[side].strip(), where, f"'{side}' must be a non-empty string")
    _check(obj["chosen"].strip() != obj["rejected"].strip(), where, "'chosen' and 'rejected' are the same text")
    prov = obj.get("provenance", {})
    _check(isinstance(prov, dict), where, "'provenance' must be a JSON object")
    return PreferencePair(obj["id"], history, obj["chosen"], obj["rejected"],
                          _check_metrics(obj.get("metrics"), where), prov)


def load_pairs(path: str | Path) -> list[PreferencePair]:
    """Read and validate a pairs JSONL file; any problem raises ``DataError`` naming file:line."""
    path = Path(path)
    pairs, seen = [], {}
    for where, lineno, obj in read_jsonl(path, "preference-pairs file"):
        pair = parse_pair(obj, where)
        if pair.id in seen:
            raise DataError(f"{where}: duplicate id {pair.id!r} (first on line {seen[pair.id]})")
        seen[pair.id] = lineno
        pairs.append(pair)
    if not pairs:
        raise DataError(f"{path}: no preference pairs")
    return pairs


def in_split(pair: PreferencePair, split: str) -> bool:
    """Whether a pair's source state lies in ``split`` (a split name or ESConv path): its provenance
    names the split (``split``), or its dialogue id carries the split's prefix (``test-12``)."""
    prov = pair.provenance
    stem = split if split in SPLITS else Path(split).stem
    named = prov.get("split")
    return (named is not None and str(named) in (split, stem)) or \
        str(prov.get("dialogue_id", "")).startswith(f"{stem}-")


def refuse_split(pairs: list[PreferencePair], split: str, user: str) -> None:
    """Raise ``DataError`` naming the first pair whose source state is in ``split`` (the test split):
    held-out states never fit the reward model or enter the retrieval corpus (``user`` says which)."""
    for pair in pairs:
        if in_split(pair, split):
            prov = pair.provenance
            raise DataError(f"pair {pair.id!r} comes from the test split {split!r} (dialogue "
                            f"{prov.get('dialogue_id')!r}, split {prov.get('split')!r}); {user} only takes "
                            "pairs from training dialogues: remove it from the file")


def write_pairs(pairs: list[PreferencePair], path: str | Path) -> Path:
    """Write pairs as JSONL atomically (temp file in the same folder, then rename)."""
    with atomic_file(path) as fh:
        for p in pairs:
            fh.write(json.dumps(p.to_json(), ensure_ascii=False) + "\n")
    return Path(path)


# --------------------------------------------------------------------------- silver pairs


def _truncate(text: str, rng: random.Random) -> str:
    words = text.split()
    keep = max(2, int(len(words) * rng.uniform(0.3, 0.6)))
    return " ".join(words[:keep]).rstrip(".,!?;:")


class NegativePool:
    """The eligible states' counselor turns, by dialogue and by problem type, to draw negatives from."""

    def __init__(self, states):
        self.states, self.by_problem, self.by_dialogue = states, {}, {}
        for s in states:
            self.by_problem.setdefault(s.problem, []).append(s)
            self.by_dialogue.setdefault(s.dialogue_id, []).append(s)

    def other(self, state, rng: random.Random, same_problem: bool = False):
        """A state of another dialogue (of the same problem type when ``same_problem`` and one exists)."""
        pool = self.by_problem.get(state.problem, []) if same_problem else self.states
        if not any(s.dialogue_id != state.dialogue_id for s in pool):
            pool = self.states
        while True:  # the pool spans many dialogues, so this ends quickly
            s = rng.choice(pool)
            if s.dialogue_id != state.dialogue_id:
                return s


def make_negative(kind: str, state, rng: random.Random, pool: NegativePool) -> str | None:
    """One rejected reply of ``kind`` for ``state`` (None: the kind has none for this state)."""
    if kind == "generic":
        return rng.choice(GENERIC_REASSURANCES)
    if kind == "lecturing":
        return rng.choice(LECTURES).format(problem=(state.problem or "problem").lower())
    if kind == "truncated":
        return _truncate(state.target, rng)
    if kind == "same_dialogue":
        far = [s for s in pool.by_dialogue.get(state.dialogue_id, [])
               if abs(s.turn_index - state.turn_index) >= OFF_CONTEXT_TURNS]
        return rng.choice(far).target if far else None
    return pool.other(state, rng, same_problem=kind == "same_problem").target


def _check_mix(negatives, per_state: int) -> None:
    unknown = sorted(set(negatives) - set(NEGATIVE_KINDS))
    if not negatives or unknown:
        raise UserError(f"silver negatives {list(negatives)}: need one or more of {', '.join(NEGATIVE_KINDS)}")
    if not 1 <= per_state <= len(set(negatives)):
        raise UserError(f"{per_state} negatives per state: need 1 to {len(set(negatives))} (the distinct kinds)")


def _state_pairs(s, rng: random.Random, pool: NegativePool, negatives, per_state: int, seed: int, split):
    """Pairs of one state: ``per_state`` distinct kinds drawn from ``negatives`` (weighted by repeats)."""
    kinds: list[str] = []
    while len(kinds) < per_state:
        kind = rng.choice(negatives)
        if kind not in kinds:
            kinds.append(kind)
    out = []
    for j, kind in enumerate(kinds):
        rejected = make_negative(kind, s, rng, pool)
        if rejected is None or rejected.strip() == s.target.strip():  # no such turn, or a duplicate turn
            kind, rejected = "generic", rng.choice(GENERIC_REASSURANCES)
        prov = {"source": "silver-esconv", "split": str(split), "dialogue_id": s.dialogue_id,
                "turn_index": s.turn_index, "negative": kind, "seed": seed}
        pid = f"silver-{s.dialogue_id}-{s.turn_index}" + (f"-{j}" if per_state > 1 else "")
        out.append(PreferencePair(pid, s.history, s.target, rejected, None, prov))
    return out


def bootstrap_pairs(split: str = "train", seed: int = 0, max_pairs: int | None = None,
                    dialogues: set[str] | None = None, negatives=DEFAULT_NEGATIVES,
                    per_state: int = 1) -> list[PreferencePair]:
    """Silver pairs from ESConv (a stand-in for ESC-Preference; see the module docstring).

    ``split`` is ``train`` or an ESConv-format JSONL path; the evaluation splits are refused so that
    they stay unseen. With ``max_pairs``, a seeded sample of the eligible states gives that many pairs.
    With ``dialogues`` (dialogue ids), only those dialogues give states and negatives. Each state gives
    ``per_state`` pairs (one gold turn against that many negatives of distinct kinds, drawn from
    ``negatives``; a kind named twice is drawn twice as often): the gold input is then shared.
    """
    if split in SPLITS and split != "train":
        raise UserError(f"--split {split}: silver pairs come from ESConv train only "
                        "(valid and test stay unseen by the reward model)")
    if max_pairs is not None and max_pairs < 1:
        raise UserError(f"--max-pairs must be >= 1, got {max_pairs}")
    _check_mix(negatives, per_state)
    states = [s for s in load_states(split) if len(s.target.split()) >= MIN_GOLD_WORDS
              and (dialogues is None or s.dialogue_id in dialogues)]
    if not states:
        raise UserError(f"{split}: no dialogue state with a gold turn of >= {MIN_GOLD_WORDS} words")
    rng = random.Random(seed)
    pool = NegativePool(states)
    n_states = None if max_pairs is None else -(-max_pairs // per_state)
    if n_states is not None and n_states < len(states):
        states = sorted(rng.sample(states, n_states), key=lambda s: (s.dialogue_id, s.turn_index))
    pairs = [p for s in states for p in _state_pairs(s, rng, pool, list(negatives), per_state, seed, split)]
    return pairs[:max_pairs]


def silver_pairs(cfg, dialogues: set[str] | None = None) -> list[PreferencePair]:
    """``bootstrap_pairs`` on ``data.train`` with the config's seed, ``reward.max_pairs`` and negative mix."""
    rc = cfg.reward
    return bootstrap_pairs(cfg.data.train, cfg.run.seed, rc.max_pairs, dialogues, rc.silver_negatives,
                           rc.silver_per_state)


def bootstrap_main(args) -> int:
    """``escrag prefs bootstrap --out FILE [--split train] [--seed N] [--max-pairs N] [--negatives K,K]
    [--per-state N]``."""
    negatives = tuple(args.negatives.split(",")) if args.negatives else DEFAULT_NEGATIVES
    pairs = bootstrap_pairs(args.split, args.seed, args.max_pairs, negatives=negatives, per_state=args.per_state)
    write_pairs(pairs, args.out)
    kinds = Counter(p.provenance["negative"] for p in pairs)
    print(f"wrote {len(pairs)} silver pairs to {args.out} "
          f"(negatives: {', '.join(f'{k} {kinds[k]}' for k in NEGATIVE_KINDS)})")
    print("note: silver pairs are a stand-in for the paper's ESC-Preference data, not a reproduction of it")
    return 0
