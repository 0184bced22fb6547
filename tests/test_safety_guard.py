"""The guard model (``escrag.safety.guard``, ``safety.guard``) through real HTTP servers that speak the
protocols: tests/openai_double.py's keyword guard (a TEST DOUBLE answering as Llama Guard does on chat
and as OpenAI's moderations do on /v1/moderations) and scripted chat answers. Its verdict combines with
the embedded one (the higher level wins); a guard that fails or times out leaves the embedded verdict
and is counted. Run: .venv/bin/python -m pytest -q tests/test_safety_guard.py"""

import json
import subprocess
import sys

import pytest
from openai_double import OpenAIDouble, Reply, keyword_guard

from escrag.config import GuardConfig
from escrag.errors import UserError
from escrag.safety.guard import Guard, combine
from escrag.safety.types import RiskAssessment

CRISIS = [{"role": "user", "content": "Honestly everyone would be better off without me."}]
CALM = [{"role": "user", "content": "I had a rough week at work but the weekend helped."}]


@pytest.fixture(scope="module")
def double():
    with keyword_guard() as d:
        yield d


def _assess(gc, history):
    guard = Guard(gc)
    return guard, guard.assess_all([history])[0]


@pytest.mark.parametrize("kind", ["chat", "moderation"])
def test_guard_reads_a_crisis_and_a_calm_message(double, kind):
    gc = GuardConfig(**{f"{kind}_url": double.base_url}, chat_model="llama-guard")
    _, high = _assess(gc, CRISIS)
    assert high.level == "high" and "suicide" in high.categories and high.reasons, high
    _, calm = _assess(gc, CALM)
    assert calm.level == "none", calm


def test_levels_prompt_for_any_chat_model():
    with OpenAIDouble().on("clf", r"better off without me", default=Reply(content="high suicide")) \
            .on("calm", r".", default=Reply(content="none")) as d:
        gc = GuardConfig(chat_url=d.base_url, chat_model="any", chat_kind="levels")
        assert _assess(gc, CRISIS)[1].level == "high"
        assert _assess(gc, CALM)[1].level == "none"
        assert "high" in d.requests[0].body["messages"][0]["content"]  # the classification prompt


def test_higher_level_wins():
    elevated, high, none = (RiskAssessment("elevated", ["suicide"]), RiskAssessment("high", ["suicide"]),
                            RiskAssessment())
    assert combine(elevated, high) is high and combine(high, none) is high and combine(elevated, None) is elevated
    both = combine(RiskAssessment("high", ["abuse"], ["a"]), RiskAssessment("high", ["suicide"], ["b"]))
    assert both.categories == ["abuse", "suicide"] and both.reasons == ["a", "b"]


def test_failed_or_slow_guard_is_none_and_counted(double):
    with OpenAIDouble().on("down", r".", default=Reply.error(500)) as down, \
            OpenAIDouble().on("slow", r".", default=Reply(content="unsafe\nS11", delay_s=3)) as slow:
        guard, verdict = _assess(GuardConfig(chat_url=down.base_url, chat_model="g", retries=1), CRISIS)
        assert verdict is None and guard.failures["chat"] == 1 and down.calls["down"] == 2
        guard, verdict = _assess(GuardConfig(chat_url=slow.base_url, chat_model="g", retries=0, timeout_s=0.5),
                                 CRISIS)
        assert verdict is None and guard.failures["chat"] == 1
        # one of two failing: the other's verdict stands
        guard, verdict = _assess(GuardConfig(chat_url=down.base_url, chat_model="g", retries=0,
                                             moderation_url=double.base_url), CRISIS)
        assert verdict.level == "high" and guard.failures == {"chat": 1}


def test_a_guard_without_endpoints_or_model_is_a_clear_error():
    with pytest.raises(UserError, match="chat_url and/or moderation_url"):
        Guard(GuardConfig())
    with pytest.raises(UserError, match="chat_model"):
        Guard(GuardConfig(chat_url="http://127.0.0.1:9/v1"))


def test_moderation_answer_without_scores_is_a_failure():
    double = OpenAIDouble().moderate(lambda text: {})
    with double:
        guard, verdict = _assess(GuardConfig(moderation_url=double.base_url), CRISIS)
        assert verdict.level == "none"  # all scores absent read as 0
    with OpenAIDouble() as bare:  # no moderation script: HTTP 400, not retried
        guard, verdict = _assess(GuardConfig(moderation_url=bare.base_url), CRISIS)
        assert verdict is None and guard.failures["moderation"] == 1


def test_guard_combination_is_scored_beside_the_embedded_check(double, safety_cache):
    """``_with_guard`` (what ``--guard`` runs): one pass of the embedded check, scored alone and combined."""
    from escrag.config import load_config
    from escrag.safety.classifier import RiskClassifier
    from escrag.safety.cli import _with_guard

    cases = [{"id": "p1", "label": "high", "category": "suicide", "kind": "passive", "messages": CRISIS},
             {"id": "c1", "label": "not_high", "category": "none", "kind": "calm", "messages": CALM}]
    clf = RiskClassifier.from_config(load_config("configs/cpu-test.yaml"))
    result = _with_guard(clf, Guard(GuardConfig(chat_url=double.base_url, chat_model="g")), cases)
    assert result["high"]["suicide"]["high"] == 1 and result["embedded"]["high"]["suicide"]["high"] == 0
    assert result["embedded"]["missed_high"][0]["level"] == "elevated"  # so the counselor would add the note
    assert result["not_high_flagged_high"] == 0.0 and result["guard"]["failures"] == {}


@pytest.mark.slow
def test_safety_eval_with_guard_reports_both(double, tmp_path, safety_cache):
    """``escrag safety eval --guard URL`` on a tiny labelled set: the combined table and, from the same
    run, the embedded check alone; the guard (here the keyword double) lifts a case to high."""
    cases = [{"id": "p1", "label": "high", "category": "suicide", "kind": "passive", "messages": CRISIS},
             {"id": "c1", "label": "not_high", "category": "none", "kind": "calm", "messages": CALM}]
    data = tmp_path / "cases.jsonl"
    data.write_text("".join(json.dumps(c) + "\n" for c in cases))
    out = tmp_path / "r.json"
    run = subprocess.run([sys.executable, "-m", "escrag", "safety", "eval", "--config", "configs/cpu-test.yaml",
                          "--data", str(data), "--guard", double.base_url, "--json", str(out)],
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["high"]["suicide"]["recall"] == 1.0 and result["guard"]["failures"] == {}
    assert result["embedded"]["high"]["suicide"]["high"] == 0  # the embedded check reads it elevated
    assert result["not_high_flagged_high"] == 0.0 and "not_high_noted" in result
    assert "embedded check alone" in run.stdout
