"""The safety design study (experiments/safety_designs/): it fits on tuning + half of round 6 and judges on
the other half, and never reads the held-out evaluation set.
Run: .venv/bin/python -m pytest -q tests/experiments/test_safety_designs.py"""

import ast
from pathlib import Path

import pytest

from escrag.safety.cases import SAFETY_DIR, load_cases
from escrag.safety.types import CATEGORIES
from experiments.safety_designs import study

pytestmark = pytest.mark.unit


def test_design_study_judges_on_a_dev_half_of_round6_and_never_reads_eval():
    """experiments/safety_designs/study.py fits on tuning + half of round 6 and judges on the other half:
    a group's versions (multi-turn, texting) sit on one side, every category has high and not-high
    cases on the dev side, and no string in the script (its docstring aside) names the eval set."""
    path = Path(study.__file__)
    r6 = load_cases(SAFETY_DIR / "tuning-round6.jsonl")
    side = {}
    for c in r6:
        assert side.setdefault(c["group"], study.dev_group(c)) == study.dev_group(c), c["group"]
    dev = [c for c in r6 if study.dev_group(c)]
    assert 0.3 < len(dev) / len(r6) < 0.7
    for cat in CATEGORIES:
        assert sum(c["label"] == "high" and c["category"] == cat for c in dev) >= 15, cat
    assert sum(c["label"] == "not_high" for c in dev) >= 100
    assert not any(study.dev_group(c) for c in load_cases("tuning"))  # tuning.jsonl is all fit
    tree = ast.parse(path.read_text())
    doc = ast.get_docstring(tree, clean=False)
    strings = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    assert not [s for s in strings if s != doc and "eval" in s.lower()], "the study must not read the eval set"
