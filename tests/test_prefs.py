"""ESC-Preference pairs: the validating loader names file:line for each kind of bad record, the writer
round-trips atomically, silver bootstrap is seeded, uses ESConv train only, keeps the gold turn as
chosen and draws every documented negative kind; the CLI writes a file and reports user errors.
Run: .venv/bin/python -m pytest -q tests/test_prefs.py"""

import json
import subprocess
import sys

import pytest

from escrag.data import DataError, load_states
from escrag.errors import UserError
from escrag.pairs import (
    DEFAULT_NEGATIVES,
    GENERIC_REASSURANCES,
    METRICS,
    NEGATIVE_KINDS,
    OFF_CONTEXT_TURNS,
    PreferencePair,
    bootstrap_pairs,
    load_pairs,
    silver_pairs,
    write_pairs,
)
from evaluation.labels import read_replies

ROOT = __import__("pathlib").Path(__file__).resolve().parent.parent

GOOD = {"id": "p1", "history": [{"role": "user", "content": "I lost my job."}],
        "chosen": "That sounds really hard. How are you holding up?", "rejected": "Cheer up.",
        "metrics": {"chosen": dict.fromkeys(METRICS, 8), "rejected": dict.fromkeys(METRICS, 3)},
        "provenance": {"source": "hand"}}


def _write(tmp_path, records):
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def test_good_file_loads_with_metrics_and_blank_lines(tmp_path):
    second = {**GOOD, "id": "p2", "metrics": None}
    del second["metrics"]
    pairs = load_pairs(_write(tmp_path, [GOOD, "", second]))
    assert [p.id for p in pairs] == ["p1", "p2"]
    assert pairs[0].metrics["chosen"]["EI"] == 8.0 and pairs[1].metrics is None
    assert pairs[0].history == GOOD["history"] and pairs[0].group == "p1"


@pytest.mark.parametrize("bad, message", [
    ("{not json", "invalid JSON"),
    ({**GOOD, "chosen": ""}, "'chosen' must be a non-empty string"),
    ({**GOOD, "rejected": GOOD["chosen"] + "  "}, "same text"),
    ({**GOOD, "history": []}, "'history' must be a non-empty list"),
    ({**GOOD, "history": [{"role": "assistant", "content": "hi"}]}, "must end with a user"),
    ({**GOOD, "history": [{"role": "system", "content": "x"}, {"role": "user", "content": "y"}]},
     "history[0]: 'role' must be one of"),
    ({**GOOD, "metrics": {"chosen": {"EI": 1}, "rejected": {}}}, "'metrics.chosen' must have exactly"),
    ({**GOOD, "metrics": {"chosen": dict.fromkeys(METRICS, "high"), "rejected": dict.fromkeys(METRICS, 1)}},
     "must be a number"),
    ({**GOOD, "extra": 1}, "unknown field 'extra'"),
    ({**GOOD, "provenance": "web"}, "'provenance' must be a JSON object"),
    ([1, 2], "not a JSON object"),
])
def test_bad_records_name_file_and_line(tmp_path, bad, message):
    path = _write(tmp_path, [GOOD | {"id": "ok"}, bad])
    with pytest.raises(DataError) as err:
        load_pairs(path)
    assert f"{path}:2:" in str(err.value) and message in str(err.value)


def test_duplicate_ids_missing_and_empty_files(tmp_path):
    with pytest.raises(DataError, match=r":2: duplicate id 'p1' \(first on line 1\)"):
        load_pairs(_write(tmp_path, [GOOD, GOOD]))
    with pytest.raises(DataError, match="no such preference-pairs file"):
        load_pairs(tmp_path / "absent.jsonl")
    with pytest.raises(DataError, match="no preference pairs"):
        load_pairs(_write(tmp_path, [""]))


def test_write_is_atomic_and_round_trips(tmp_path):
    pairs = [PreferencePair("a", [{"role": "user", "content": "x"}], "good reply", "bad reply", None, {"k": 1})]
    path = write_pairs(pairs, tmp_path / "sub" / "out.jsonl")
    assert load_pairs(path) == pairs
    assert [p.name for p in path.parent.iterdir()] == ["out.jsonl"]  # no temp file left behind
    assert "metrics" not in json.loads(path.read_text())  # optional field omitted when absent


def test_bootstrap_is_seeded_uses_gold_and_all_negative_kinds():
    pairs = bootstrap_pairs("train", seed=3, max_pairs=200, negatives=NEGATIVE_KINDS)
    assert len(pairs) == 200 and pairs == bootstrap_pairs("train", seed=3, max_pairs=200, negatives=NEGATIVE_KINDS)
    assert pairs != bootstrap_pairs("train", seed=4, max_pairs=200, negatives=NEGATIVE_KINDS)
    gold = {(s.dialogue_id, s.turn_index): s for s in load_states("train")}
    kinds = set()
    for p in pairs:
        state = gold[(p.provenance["dialogue_id"], p.provenance["turn_index"])]
        assert p.chosen == state.target and p.history == state.history and p.rejected.strip() != p.chosen.strip()
        assert p.provenance["split"] == "train" and p.provenance["source"] == "silver-esconv"
        kind = p.provenance["negative"]
        kinds.add(kind)
        if kind == "generic":
            assert p.rejected in GENERIC_REASSURANCES
        if kind == "truncated":
            assert p.chosen.startswith(p.rejected.rstrip(".,!?;:")) and len(p.rejected) < len(p.chosen)
    assert kinds == set(NEGATIVE_KINDS)
    assert len({p.id for p in pairs}) == len(pairs)


def _norm(text: str) -> str:
    return " ".join("".join(c for c in text.lower() if c.isalnum() or c.isspace()).split())


def test_training_generic_replies_are_not_the_evaluation_list():
    """The reward is checked on generic replies it never trained against (issue 53, item 2)."""
    evaluation = read_replies(ROOT / "experiments/reward_recipe/generic_eval.txt")
    assert len(evaluation) >= 20 and len(GENERIC_REASSURANCES) >= 20
    assert not {_norm(t) for t in GENERIC_REASSURANCES} & {_norm(t) for t in evaluation}


def test_hard_negatives_are_what_their_kind_says():
    states = {(s.dialogue_id, s.turn_index): s for s in load_states("train")}
    kinds = ("same_problem", "same_dialogue", "other_dialogue")
    pairs = bootstrap_pairs("train", seed=1, max_pairs=300, negatives=kinds, per_state=3)
    turns = {}
    for s in states.values():
        turns.setdefault(s.target, []).append(s)
    seen = set()
    for p in pairs:
        state = states[(p.provenance["dialogue_id"], p.provenance["turn_index"])]
        kind = p.provenance["negative"]
        seen.add(kind)
        if kind == "generic":  # the fallback when a dialogue has no turn far enough away
            continue
        sources = turns[p.rejected]
        if kind == "same_problem":
            assert any(s.dialogue_id != state.dialogue_id and s.problem == state.problem for s in sources)
        if kind == "same_dialogue":
            assert any(s.dialogue_id == state.dialogue_id and abs(s.turn_index - state.turn_index) >= OFF_CONTEXT_TURNS
                       for s in sources)
        if kind == "other_dialogue":
            assert any(s.dialogue_id != state.dialogue_id for s in sources)
    assert set(kinds) <= seen


def test_several_negatives_per_state_share_its_gold_turn():
    pairs = bootstrap_pairs("train", seed=0, max_pairs=60, negatives=("other_dialogue", "generic", "truncated"),
                            per_state=3)
    assert len(pairs) == 60 and len({p.id for p in pairs}) == 60
    by_state = {}
    for p in pairs:
        by_state.setdefault((p.provenance["dialogue_id"], p.provenance["turn_index"]), []).append(p)
    assert len(by_state) == 20
    for group in by_state.values():
        assert len({p.chosen for p in group}) == 1 and len({p.provenance["negative"] for p in group}) == 3
    with pytest.raises(UserError, match="negatives per state"):
        bootstrap_pairs("train", max_pairs=6, negatives=("generic",), per_state=2)
    with pytest.raises(UserError, match="silver negatives"):
        bootstrap_pairs("train", max_pairs=6, negatives=("rude",))


def test_the_config_picks_the_negative_mix():
    from escrag.config import load_config

    cfg = load_config(ROOT / "configs/cpu-test.yaml", ["reward.max_pairs=40", "reward.silver_negatives=[same_problem]"])
    assert {p.provenance["negative"] for p in silver_pairs(cfg)} == {"same_problem"}
    cfg = load_config(ROOT / "configs/cpu-test.yaml", ["reward.max_pairs=40", "reward.silver_per_state=2",
                                                       "reward.silver_negatives=[generic,truncated]"])
    pairs = silver_pairs(cfg)
    assert len(pairs) == 40 and len({p.chosen for p in pairs}) <= 20
    assert {p.provenance["negative"] for p in pairs} == {"generic", "truncated"}


def test_the_embedded_default_trains_on_the_chosen_mix():
    """configs/cpu-demo.yaml's silver pairs: each of 300 states against three kinds (experiments/reward_recipe/)."""
    from escrag.config import load_config

    pairs = silver_pairs(load_config(ROOT / "configs/cpu-demo.yaml"))
    states = {(p.provenance["dialogue_id"], p.provenance["turn_index"]) for p in pairs}
    assert len(pairs) == 900 and len(states) == 300
    assert {p.provenance["negative"] for p in pairs} == {"other_dialogue", "same_problem", "generic"}


def test_config_choices_are_the_kinds_and_poolings():
    import typing

    from escrag.config.schema import RewardConfig
    from reward_server.model import POOLINGS

    fields = RewardConfig.__pydantic_fields__
    (kinds,) = typing.get_args(fields["silver_negatives"].annotation)
    assert typing.get_args(kinds) == NEGATIVE_KINDS
    assert typing.get_args(fields["pooling"].annotation) == POOLINGS
    assert tuple(RewardConfig().silver_negatives) == DEFAULT_NEGATIVES


def test_bootstrap_refuses_evaluation_splits():
    for split in ("valid", "test"):
        with pytest.raises(UserError, match="train only"):
            bootstrap_pairs(split)


def test_cli_bootstrap_writes_valid_file_and_reports_errors(tmp_path):
    out = tmp_path / "silver.jsonl"
    cmd = [sys.executable, "-m", "escrag", "prefs", "bootstrap", "--out", str(out), "--max-pairs", "12"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "wrote 12 silver pairs" in proc.stdout and "stand-in" in proc.stdout
    assert len(load_pairs(out)) == 12
    proc = subprocess.run([*cmd, "--negatives", "same_problem,generic", "--per-state", "2"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert {p.provenance["negative"] for p in load_pairs(out)} == {"same_problem", "generic"}
    proc = subprocess.run([*cmd[:-2], "--split", "test"], capture_output=True, text=True)
    assert proc.returncode == 2 and "train only" in proc.stderr and "Traceback" not in proc.stderr
