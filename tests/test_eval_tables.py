"""Pure pieces of the evaluation: bootstrap intervals (coverage on a known distribution, degenerate
inputs, seeding), the Table 1 / Table 2 layouts and CSV from hand-made per-state scores (means and
deltas checked by hand), malformed judgments left out and counted, Fleiss' kappa against hand-computed
and published examples, the human-study majority rule, and the copy / distinct-2 statistics of the
offline proxy.
Run: .venv/bin/python -m pytest -q tests/test_eval_tables.py"""

import csv
import io
import math

import numpy as np
import pytest

from escrag.pairs import METRICS
from evaluation.human import fleiss_kappa, majority, outcome
from evaluation.proxy import copies, distinct_n
from evaluation.tables import bootstrap_ci, rows_csv, score_rows, table1_markdown, table2_markdown

pytestmark = pytest.mark.unit


def test_bootstrap_interval_covers_the_mean_at_about_the_nominal_rate():
    rng = np.random.default_rng(0)
    hits = 0
    for trial in range(200):
        x = rng.normal(5.0, 2.0, size=60)
        mean, lo, hi = bootstrap_ci(x, 400, 0.95, seed=trial)
        assert lo <= mean <= hi and mean == pytest.approx(x.mean())
        hits += lo <= 5.0 <= hi
    assert 0.88 <= hits / 200 <= 0.99  # percentile bootstrap at n=60: close to 95%


def test_bootstrap_width_matches_standard_error_and_is_seeded():
    x = np.random.default_rng(1).normal(0, 1, size=400)
    mean, lo, hi = bootstrap_ci(x, 2000, 0.95, seed=3)
    se = x.std(ddof=1) / math.sqrt(len(x))
    assert (hi - lo) == pytest.approx(2 * 1.96 * se, rel=0.1)
    assert bootstrap_ci(x, 2000, 0.95, seed=3) == (mean, lo, hi)
    assert bootstrap_ci([7, 7, 7], 100, 0.95, 0) == (7.0, 7.0, 7.0)
    assert all(math.isnan(v) for v in bootstrap_ci([], 100, 0.95, 0))


def rec(system, sid, scores=None, valid=True):
    judge = {"valid": valid, "scores": scores if valid else None, "repaired": False, "cost": 0.0}
    return {"system": system, "state_id": sid, "judge": judge}


def test_tables_have_the_paper_layout_and_hand_checked_numbers():
    a1 = dict(zip(METRICS, [8, 8, 8, 9, 7, 8, 6]))  # avg 54/7
    a2 = dict(zip(METRICS, [6, 6, 6, 7, 5, 6, 4]))  # avg 40/7
    b1 = dict(zip(METRICS, [9] * 7))
    per_state = [rec("a", "s1", a1), rec("a", "s2", a2), rec("a", "s3", valid=False),
                 rec("b", "s1", b1), rec("b", "s2", b1), {"system": "b", "state_id": "s3", "judge": None}]
    rows = score_rows(per_state, [("a", "Base"), ("b", "Full")], 200, 0.95, 0)
    a, b = rows
    assert (a["n"], a["malformed"], a["unjudged"]) == (2, 1, 0) and (b["n"], b["unjudged"]) == (2, 1)
    assert a["EI"][0] == 7.0 and a["SC"][0] == 8.0 and a["Avg"][0] == pytest.approx(47 / 7)
    assert a["EI"][1] == 6.0 and a["EI"][2] == 8.0  # two states: the resampled means span 6..8
    md = table1_markdown(rows, "Table 1", ["note"])
    lines = md.splitlines()
    header = next(line for line in lines if line.startswith("| System"))
    assert header == ("| System | Client: EI | NE | TA | Counselor: SC | TH | Judge: SF | PT | Avg | n | malformed |")
    assert any(line.startswith("| Full | 9.00 [9.00, 9.00]") for line in lines)
    t2 = table2_markdown(rows, "Table 2", [])
    full = next(line for line in t2.splitlines() if line.startswith("| Full"))
    assert f"| {9 - 47 / 7:+.2f} |" in full  # Δ Avg against the first row
    parsed = list(csv.DictReader(io.StringIO(rows_csv(rows))))
    assert parsed[0]["label"] == "Base" and float(parsed[0]["Avg"]) == pytest.approx(47 / 7, abs=1e-4)
    assert {"EI_lo", "EI_hi", "Avg_lo", "Avg_hi", "malformed"} <= set(parsed[0])


def test_fleiss_kappa_hand_computed():
    # 3 items, 3 raters, 3 categories: P_i = 1, 1, 0 -> P̄ = 2/3; p_j = 4/9, 4/9, 1/9 -> P_e = 33/81;
    # kappa = (2/3 - 11/27) / (1 - 11/27) = 7/16
    assert fleiss_kappa([[3, 0, 0], [0, 3, 0], [1, 1, 1]]) == pytest.approx(7 / 16)
    assert fleiss_kappa([[2, 0], [0, 2]]) == pytest.approx(1.0)  # perfect agreement, both categories used
    assert math.isnan(fleiss_kappa([[3, 0, 0], [3, 0, 0]]))  # one category only: undefined
    with pytest.raises(ValueError):
        fleiss_kappa([[2, 1, 0], [1, 1, 0]])


def test_fleiss_kappa_published_example():
    # Fleiss (1971) style worked example (Wikipedia "Fleiss' kappa"): 10 items, 14 raters, 5 categories
    table = [[0, 0, 0, 0, 14], [0, 2, 6, 4, 2], [0, 0, 3, 5, 6], [0, 3, 9, 2, 0], [2, 2, 8, 1, 1],
             [7, 7, 0, 0, 0], [3, 2, 6, 3, 0], [2, 5, 3, 2, 2], [6, 5, 2, 1, 0], [0, 2, 2, 3, 7]]
    assert fleiss_kappa(table) == pytest.approx(0.210, abs=5e-4)


def test_outcome_and_majority():
    row = {"system_a": "base", "system_b": "ours", "study": "ours"}
    assert [outcome(c, row) for c in ("A", "B", "tie")] == ["loss", "win", "tie"]
    assert majority(["win", "win", "loss"]) == "win" and majority(["win", "tie", "loss"]) == "tie"
    assert majority(["loss"]) == "loss" and majority(["win", "loss"]) == "tie"


def test_copy_rate_needs_a_long_shared_run_of_words():
    ex = [{"history": "Client: I lost my job.", "response": "It is completely understandable that you feel "
                                                           "lost after losing a job you loved so much."}]
    copied = "Well, it is completely understandable that you feel lost after losing a job, really."
    assert copies(copied, ex, 8)
    assert not copies("It is understandable that you feel lost, and losing a job hurts.", ex, 8)
    assert not copies(copied, [], 8) and not copies("short", ex, 8)
    assert copies("Client: I lost my job. Sorry to hear", [{"history": "Client: I lost my job.", "response": ""}], 4)


def test_distinct_2():
    assert distinct_n(["a b a b"], 2) == pytest.approx(2 / 3)
    assert distinct_n(["a b", "a b"], 2) == pytest.approx(1 / 2)
    assert distinct_n(["one"], 2) == 0.0


def test_paired_delta_matches_states_and_ignores_unpaired_ones():
    from evaluation.proxy import paired_deltas

    recs = [{"system": s, "state_id": f"d{i}/1", "answer_key": f"{s}{i}"} for s in ("a", "b") for i in range(4)]
    recs.append({"system": "b", "state_id": "d9/1", "answer_key": "b9"})  # only b answered it
    rm = {f"a{i}": float(i) for i in range(4)} | {f"b{i}": float(i) + 0.5 * (i % 2) for i in range(4)} | {"b9": 99.0}
    assert sorted(paired_deltas(recs, rm, "b", "a")) == [0.0, 0.0, 0.5, 0.5]
    assert paired_deltas(recs, rm, "a", "a") == [0.0] * 4

