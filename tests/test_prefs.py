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
    GENERIC_REASSURANCES,
    METRICS,
    NEGATIVE_KINDS,
    PreferencePair,
    bootstrap_pairs,
    load_pairs,
    write_pairs,
)

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
    pairs = bootstrap_pairs("train", seed=3, max_pairs=200)
    assert len(pairs) == 200 and pairs == bootstrap_pairs("train", seed=3, max_pairs=200)
    assert pairs != bootstrap_pairs("train", seed=4, max_pairs=200)
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
    proc = subprocess.run([*cmd[:-2], "--split", "test"], capture_output=True, text=True)
    assert proc.returncode == 2 and "train only" in proc.stderr and "Traceback" not in proc.stderr
