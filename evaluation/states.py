"""The test states an evaluation scores: a seeded sample of ESConv test (or all of it), saved with the run.

Owns: ``sample_states(cfg)`` and the run's ``states.jsonl`` (id, dialogue, history, gold reply), which
the human-study export reads back, so a run folder is self-contained.

Held out means held out: the split is ``data.test``; ``train`` and ``valid`` are refused, since they
fit the reward model, the retrieval corpus, the policy and its checkpoints.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from escrag.atomic import atomic_file
from escrag.config import Config, ConfigError
from escrag.data import DialogueState, load_states

REFUSED = ("train", "valid")


def sample_states(cfg: Config) -> list[DialogueState]:
    """``eval.states`` test states drawn with ``run.seed`` (all when None), in data order."""
    if cfg.data.test in REFUSED:
        raise ConfigError(f"data.test: evaluation runs on held-out test states, not {cfg.data.test!r}")
    states = load_states(cfg.data.test)
    n = cfg.eval.states
    if n is None or n >= len(states):
        return states
    keep = sorted(random.Random(cfg.run.seed).sample(range(len(states)), n))
    return [states[i] for i in keep]


def write_states(states: list[DialogueState], path: str | Path) -> None:
    with atomic_file(path) as fh:
        for s in states:
            fh.write(json.dumps({"state_id": s.state_id, "dialogue_id": s.dialogue_id,
                                 "turn_index": s.turn_index, "history": s.history, "target": s.target},
                                ensure_ascii=False) + "\n")


def read_states(path: str | Path) -> dict[str, dict]:
    """state id -> the saved record."""
    from escrag.data import read_jsonl

    return {obj["state_id"]: obj for _, _, obj in read_jsonl(path, "evaluation states file")}
