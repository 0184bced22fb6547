"""ESC-Preference construction (escrag/preference/build.py) against the scripted OpenAI-protocol double.

Checks: ``dominates`` (ties, strictness, the three-metric rule, missing / unknown / out-of-range metrics
raise); the typed stage records and the evaluator's ratings parse strictly; config and split checks
refuse a build before any call; a 20-state build (two simulated client turns, three candidates) whose
scripted answers include malformed JSON (one candidate, all candidates, all but one at every stage,
the stage evaluator once and for good, the judge for good, an empty client turn), 429 with
Retry-After, 500 and a timeout keeps
exactly the states whose scripted judge scores dominate (the low trajectory's reply where it is the
dominant one) and drops the others with the scripted reason, counting every malformed answer; a
rerun makes no call; a build stopped by its budget (exit 3, one line, outputs kept) and resumed makes
no call twice (every request body at the double is new) and writes the same pairs as an uninterrupted
build; a state whose calls fail for good exits 1 and the rerun retries only that; the reward-model
trainer and the index builder take the output and refuse a test-split pair by name.
Run: .venv/bin/python -m pytest -q tests/test_preference.py"""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from openai_double import OpenAIDouble, Reply

from escrag.config import ConfigError, from_dict, load_config
from escrag.data import DataError
from escrag.pairs import METRICS, load_pairs
from escrag.preference.build import (
    CounselingStage,
    PromptSet,
    PsychState,
    Strategy,
    build,
    dominates,
    parse_ratings,
    parse_record,
    select_states,
)

ROOT = Path(__file__).resolve().parent.parent
CANDS = ("cand-a", "cand-b", "cand-c")
STAGE_SCORE = {"cand-a": 9, "cand-b": 5, "cand-c": 2}  # the evaluator's ratings: high path a, low path c
TASKS = {"client": r"Task: simulate the client's next turn", "counselor": r"Task: write the counselor's next turn",
         "stage": r"Task: identify the counseling stage", "state": r"Task: assess the client's psychological",
         "strategy": r"Task: select the therapeutic strategy", "select": r"Task: rate candidate analyses",
         "response": r"Task: write the counselor's reply from the analysis", "judge": r"Rate the reply on seven"}
PER_STATE = {"client": 2, "counselor": 1, "stage": 3, "state": 6, "strategy": 6, "select": 5, "response": 2,
             "judge": 2}  # calls of a state without incident (27)


# ----------------------------------------------------------------------------- dominates


def m(*values):
    return dict(zip(METRICS, values))


def test_dominates_ties_strictness_and_three_metrics():
    assert dominates(m(8, 8, 8, 7, 7, 7, 7), m(7, 7, 7, 7, 7, 7, 7))  # >= on all, > on three
    assert not dominates(m(8, 8, 7, 7, 7, 7, 7), m(7, 7, 7, 7, 7, 7, 7))  # > on two only
    assert not dominates(m(7, 7, 7, 7, 7, 7, 7), m(7, 7, 7, 7, 7, 7, 7))  # a tie dominates nothing
    assert not dominates(m(10, 10, 10, 10, 10, 10, 6), m(7, 7, 7, 7, 7, 7, 7))  # worse on one
    assert dominates(m(7.5, 7.5, 7.5, 7, 7, 7, 7), m(7, 7, 7, 7, 7, 7, 7))  # numbers, not only ints
    a, b = m(9, 9, 9, 9, 9, 9, 9), m(1, 1, 1, 1, 1, 1, 1)
    assert dominates(a, b) and not dominates(b, a)


@pytest.mark.parametrize("bad, message", [
    ({k: 5 for k in METRICS if k != "PT"}, "preferred: missing metric"),
    ({**m(5, 5, 5, 5, 5, 5, 5), "XX": 3}, "preferred: unknown metric"),
    (m(5, 5, 5, 5, 5, 5, 11), r"preferred.PT: must be a number from 1 to 10, got 11"),
    (m(0, 5, 5, 5, 5, 5, 5), r"preferred.EI: must be a number from 1 to 10, got 0"),
    (m(5, 5, 5, 5, 5, 5, None), "preferred.PT"),
    (m(5, 5, 5, 5, 5, 5, float("nan")), "preferred.PT"),
    (m(5, 5, 5, 5, 5, 5, True), "preferred.PT"),
])
def test_dominates_refuses_bad_metrics(bad, message):
    with pytest.raises(DataError, match=message):
        dominates(bad, m(1, 1, 1, 1, 1, 1, 1))
    with pytest.raises(DataError, match=message.replace("preferred", "other")):
        dominates(m(9, 9, 9, 9, 9, 9, 9), bad)


# ----------------------------------------------------------------------------- parsing


def test_stage_records_parse_strictly():
    rec, err = parse_record("stage", '```json\n{"stage": "Comforting", "rationale": "She is crying."}\n```')
    assert rec == CounselingStage("comforting", "She is crying.") and err == ""
    rec, _ = parse_record("state", '{"distress": 8, "resilience": 3, "motivation": 5, "summary": "Overwhelmed."}')
    assert rec == PsychState(8, 3, 5, "Overwhelmed.")
    rec, _ = parse_record("strategy", '{"strategy": "reflection of feelings", "rationale": "Name the fear."}')
    assert rec == Strategy("Reflection of feelings", "Name the fear.")
    for step, text, why in [
        ("stage", "The client is in exploration.", "not a JSON object"),
        ("stage", '{"stage": "venting", "rationale": "x"}', "stage must be one of"),
        ("stage", '{"stage": "action"}', "expected exactly the keys stage, rationale"),
        ("state", '{"distress": 11, "resilience": 3, "motivation": 5, "summary": "x"}', "distress must be an integer"),
        ("state", '{"distress": "8", "resilience": 3, "motivation": 5, "summary": "x"}', "distress must be an integer"),
        ("strategy", '{"strategy": "Hugging", "rationale": "x"}', "strategy must be one of"),
        ("strategy", '{"strategy": "Question", "rationale": "  "}', "rationale must be a non-empty string"),
        ("strategy", '[1, 2]', "expected a JSON object"),
    ]:
        rec, err = parse_record(step, text)
        assert rec is None and why in err, (text, err)
    assert parse_ratings('{"A": 3, "B": 9}', ["A", "B"]) == ({"A": 3, "B": 9}, "")
    assert parse_ratings('{"A": 3}', ["A", "B"])[0] is None
    assert "B must be an integer" in parse_ratings('{"A": 3, "B": 9.5}', ["A", "B"])[1]


# ----------------------------------------------------------------------------- config checks


def base_config(tmp_path, url="http://127.0.0.1:9/v1", **prefs) -> dict:
    eps = {n: {"base_url": url, "model": n, "timeout_s": 1.0, "retries": 3, "backoff_s": 0.05,
               "price_input_per_m": 100.0, "price_output_per_m": 100.0}
           for n in (*CANDS, "gen", "judge", "client")}
    return {"run": {"output_dir": str(tmp_path / "run"), "seed": 0}, "endpoints": eps,
            "prefs": {"candidates": list(CANDS), "generator": "gen", "evaluator": "judge", "client": "client",
                      "simulate_turns": 2, "concurrency": 4, "output_dir": str(tmp_path / "out"), **prefs}}


@pytest.mark.parametrize("change, message", [
    ({"prefs": {"candidates": ["cand-a"]}}, "prefs.candidates: name at least two"),
    ({"prefs": {"candidates": ["cand-a", "cand-a"]}}, "prefs.candidates: name at least two different"),
    ({"prefs": {"evaluator": None}}, "prefs.evaluator: name an endpoint"),
    ({"prefs": {"client": None}}, "prefs.client: simulate_turns > 0 needs"),
    ({"prefs": {"generator": "gpt-9"}}, "prefs.generator: no endpoint 'gpt-9'"),
    ({"data": {"train": "test"}}, "data.train: ESC-Preference is built from training dialogues only"),
    ({"data": {"train": "valid"}}, "data.train: ESC-Preference is built from training dialogues only"),
    ({"prefs": {"state_ids": ["train-1/999"]}}, "prefs.state_ids: no state 'train-1/999'"),
    ({"prefs": {"templates": "prefs_v0"}}, "prefs.templates: no prompt set 'prefs_v0'"),
])
def test_bad_builds_are_refused_before_any_call(tmp_path, change, message):
    data = base_config(tmp_path)
    for section, values in change.items():
        data.setdefault(section, {}).update(values)
    with pytest.raises(ConfigError, match=re.escape(message)):
        build(from_dict(data))
    assert not (tmp_path / "out" / "records.jsonl").exists()


def test_state_sample_is_seeded_train_only_and_skips_short_histories(tmp_path):
    cfg = from_dict(base_config(tmp_path, states=30, min_history_turns=5))
    a, b = select_states(cfg), select_states(cfg)
    assert [s.state_id for s in a] == [s.state_id for s in b] and len(a) == 30
    assert all(s.dialogue_id.startswith("train-") and len(s.history) >= 5 for s in a)
    other = select_states(from_dict(base_config(tmp_path, states=30, min_history_turns=5), ["run.seed=1"]))
    assert [s.state_id for s in other] != [s.state_id for s in a]


# ----------------------------------------------------------------------------- the scripted double


def pick_states(n: int) -> list:
    """n train states whose gold turn is unique and long enough to find in a prompt."""
    cfg = from_dict({"prefs": {"states": 400, "min_history_turns": 3}})
    seen, dialogues, out = set(), set(), []
    for s in select_states(cfg):  # one state per dialogue: no prompt holds another state's gold turn
        if len(s.target) > 40 and s.target not in seen and s.dialogue_id not in dialogues:
            seen.add(s.target)
            dialogues.add(s.dialogue_id)
            out.append(s)
    return out[:n]


def text_of(body: dict) -> str:
    return "\n".join(msg["content"] for msg in body["messages"])


class Script:
    """Answers of every role for the states given, with per-state incidents (``special``)."""

    def __init__(self, states, special=None):
        self.states, self.special = states, special or {}

    def index(self, body: dict) -> int:
        text = text_of(body)
        tag = re.search(r"\(s(\d\d)\)", text)
        if tag:
            return int(tag.group(1))
        return next(i for i, s in enumerate(self.states) if s.target in text)

    def client(self, body):
        i = self.index(body)
        return "" if self.special.get(i) == "empty_client" else f"I keep going over it in my head (s{i:02d})."

    def counselor(self, body):
        return f"That sounds really heavy; what has been hardest? (s{self.index(body):02d})"

    def candidate(self, step: str):
        def answer(body):
            i, model = self.index(body), body["model"]
            if (self.special.get(i), model) in (("bad_b_stage", "cand-b"),) and step == "stage":
                return '{"stage": "exploration", "rationale": '  # cut off: malformed JSON
            if self.special.get(i) == "bad_all_state" and step == "state":
                return "The client seems sad and tired."
            if self.special.get(i) == "only_a" and model != "cand-a":
                return "I would rather not answer in JSON."
            return json.dumps({"stage": {"stage": "exploration", "rationale": f"{model} sees an open problem."},
                               "state": {"distress": 7, "resilience": 4, "motivation": 5,
                                         "summary": f"{model} sees a tired client."},
                               "strategy": {"strategy": "Reflection of feelings",
                                            "rationale": f"{model} would name the feeling."}}[step])
        return answer

    def select(self, body):
        i, text = self.index(body), body["messages"][1]["content"]
        if self.special.get(i) == "bad_select":
            return "All three are fine."
        if self.special.get(i) == "select_once" and "(counseling stage)" in text and len(body["messages"]) == 2:
            return "Scores: A=9"  # the stage-1 rating, once: the repair call (4 messages) gets a valid one
        blocks = re.findall(r"\[([A-Z])\]\n(\{.*?\})\n", text + "\n")
        return json.dumps({label: next(v for k, v in STAGE_SCORE.items() if k in block)
                           for label, block in blocks})

    def response(self, body):
        analysis = body["messages"][1]["content"].split("Your analysis for this turn:")[1]
        branch = "high" if "cand-a" in analysis else "low" if "cand-c" in analysis else "mixed"
        return f"It sounds exhausting, and I am here with you [{branch}]."

    def judge(self, body):
        i = self.index(body)
        branch = re.search(r"<reply>\s*.*\[(\w+)\]", body["messages"][1]["content"]).group(1)
        if self.special.get(i) == "bad_judge" and branch == "high":
            return '{"EI": 9, "NE": 9}'
        return json.dumps(judge_scores(i)[branch])

    def install(self, llm: OpenAIDouble, errors: dict | None = None) -> OpenAIDouble:
        """HTTP incidents first (``errors``: rule key -> (pattern, queue)), then one rule per role."""
        for key, (pattern, queue, answer) in (errors or {}).items():
            llm.on(key, pattern, queue, default=Reply(content=getattr(self, answer)))
        llm.on("client", TASKS["client"], default=Reply(content=self.client))
        llm.on("counselor", TASKS["counselor"], default=Reply(content=self.counselor))
        for step in ("stage", "state", "strategy"):
            llm.on(step, TASKS[step], default=Reply(content=self.candidate(step)))
        llm.on("select", TASKS["select"], default=Reply(content=self.select))
        llm.on("response", TASKS["response"], default=Reply(content=self.response))
        llm.on("judge", TASKS["judge"], default=Reply(content=self.judge))
        return llm


def all_of(*patterns: str) -> str:
    """A regex matching a text that contains every pattern, in any order."""
    return r"\A" + "".join(rf"(?=[\s\S]*{p})" for p in patterns)


def judge_scores(i: int) -> dict:
    """By i % 5: 0 high dominates, 1 low dominates on exactly three metrics, 2 high better on two
    only, 3 mixed, 4 a tie."""
    return [{"high": m(8, 8, 8, 8, 8, 8, 8), "low": m(5, 5, 5, 5, 5, 5, 5)},
            {"high": m(6, 6, 6, 6, 6, 6, 6), "low": m(7, 7, 7, 6, 6, 6, 6)},
            {"high": m(7, 7, 6, 6, 6, 6, 6), "low": m(6, 6, 6, 6, 6, 6, 6)},
            {"high": m(9, 9, 9, 9, 9, 3, 6), "low": m(5, 5, 5, 5, 5, 5, 6)},
            {"high": m(6, 6, 6, 6, 6, 6, 6), "low": m(6, 6, 6, 6, 6, 6, 6)}][i % 5]


SPECIAL = {0: "bad_b_stage", 1: "select_once", 11: "bad_all_state", 12: "bad_select", 15: "bad_judge",
           16: "empty_client", 17: "only_a"}
ERRORS = {  # rule key -> (pattern, queue, default answer): 429, 500 and a timeout, once each
    "judge-429": (all_of(TASKS["judge"], r"\(s05\)", r"\[high\]"), [Reply.error(429, retry_after=0.2)], "judge"),
    "response-500": (all_of(TASKS["response"], r"\(s06\)", "cand-c"), [Reply.error(500)], "response"),
    "judge-slow": (all_of(TASKS["judge"], r"\(s10\)", r"\[low\]"), [], "judge"),  # queue: see `built`
}
KEPT = {0: "high", 1: "low", 5: "high", 6: "low", 10: "high"}
DROPPED = {11: "malformed_state", 12: "malformed_select", 15: "malformed_judge", 16: "malformed_client",
           17: "same_trajectory", **{i: "not_dominant" for i in (2, 3, 4, 7, 8, 9, 13, 14, 18, 19)}}


def write_config(tmp_path, url, states, name="prefs.yaml", **prefs) -> Path:
    data = base_config(tmp_path, url, state_ids=[s.state_id for s in states], **prefs)
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data))
    return path


def escrag(*args, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "escrag", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


@pytest.fixture(scope="module")
def states20():
    return pick_states(20)


@pytest.fixture(scope="module")
def built(tmp_path_factory, states20):
    """The 20-state build through the CLI against the double, then a rerun."""
    tmp = tmp_path_factory.mktemp("prefs20")
    script = Script(states20, SPECIAL)
    errors = dict(ERRORS)
    pattern, _, answer = errors["judge-slow"]
    errors["judge-slow"] = (pattern, [Reply(content=script.judge, delay_s=1.6)], answer)
    with script.install(OpenAIDouble(), errors) as llm:
        config = write_config(tmp, llm.base_url, states20, json_mode=True)
        first = escrag("prefs", "build", "--config", str(config))
        counts = dict(llm.calls)
        llm.reset()
        again = escrag("prefs", "build", "--config", str(config))
        rerun_calls = llm.total
    return {"tmp": tmp, "first": first, "again": again, "counts": counts, "rerun_calls": rerun_calls,
            "out": tmp / "out", "states": states20}


def test_build_keeps_exactly_the_dominant_pairs(built):
    assert built["first"].returncode == 0, built["first"].stderr[-3000:]
    out, states = built["out"], built["states"]
    pairs = load_pairs(out / "pairs.jsonl")
    by_state = {p.provenance["state_id"]: p for p in pairs}
    assert set(by_state) == {states[i].state_id for i in KEPT}
    for i, branch in KEPT.items():
        p = by_state[states[i].state_id]
        other = "low" if branch == "high" else "high"
        assert p.provenance["chosen_trajectory"] == branch
        assert p.chosen.endswith(f"[{branch}].") and p.rejected.endswith(f"[{other}].")
        assert p.metrics == {"chosen": {k: float(v) for k, v in judge_scores(i)[branch].items()},
                             "rejected": {k: float(v) for k, v in judge_scores(i)[other].items()}}
        assert dominates(p.metrics["chosen"], p.metrics["rejected"])
        # history: the state, the gold turn, a simulated client turn, a generated counselor turn, another client turn
        s = states[i]
        assert p.history[:len(s.history)] == s.history and p.history[len(s.history)]["content"] == s.target
        assert [t["role"] for t in p.history[len(s.history):]] == ["assistant", "user", "assistant", "user"]
        assert p.history[-1]["content"] == f"I keep going over it in my head (s{i:02d})."
        prov = p.provenance
        assert prov["split"] == "train" and prov["dialogue_id"] == s.dialogue_id and prov["simulated_turns"] == 2
        assert prov["prompt_version"].startswith("prefs_v1@") and prov["judge_template"].startswith("judge_v1@")
        assert prov["models"]["candidates"] == {c: c for c in CANDS} and prov["models"]["evaluator"] == "judge"
        want = {"high": "cand-a", "low": "cand-c"}
        for side, b in (("chosen", branch), ("rejected", other)):
            path = prov["trajectories"][side]
            assert [st["step"] for st in path] == ["stage", "state", "strategy"]
            assert {st["endpoint"] for st in path} == {want[b]}
            assert [st["score"] for st in path] == [STAGE_SCORE[want[b]]] * 3
        assert prov["strategy"] == "Reflection of feelings"


def test_build_drops_the_others_with_their_reason(built):
    out, states = built["out"], built["states"]
    rejects = [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]
    assert {r["state_id"]: r["reason"] for r in rejects} == {states[i].state_id: why for i, why in DROPPED.items()}
    nd = next(r for r in rejects if r["state_id"] == states[3].state_id)
    assert nd["detail"] == "high path better on 5, worse on 1, equal on 1" and nd["scores"]["high"]["SF"] == 3
    summary = json.loads((out / "summary.json").read_text())
    assert summary["states"] == {"selected": 20, "kept": 5, "dropped": 15, "failed": 0, "pending": 0}
    assert summary["dropped"] == {"malformed_client": 1, "malformed_judge": 1, "malformed_select": 1,
                                  "malformed_state": 1, "not_dominant": 10, "same_trajectory": 1}
    # s00: one candidate's stage answer; s11: three state answers on each path; s12 and s15: for good
    # after the repair call; s16: the client; s17: two candidates at each stage (one path: no contrast)
    assert summary["malformed_answers"] == {"client": 1, "judge": 1, "select": 1, "stage": 3, "state": 8,
                                            "strategy": 2}
    assert summary["repaired_answers"] == {"select": 1}
    assert summary["chosen_trajectory"] == {"high": 3, "low": 2}
    kept = [judge_scores(i) for i in KEPT]
    chosen = [s[b] for s, b in zip(kept, KEPT.values())]
    assert summary["metric_means"]["chosen"]["EI"] == pytest.approx(sum(c["EI"] for c in chosen) / 5)
    assert summary["stopped_by_budget"] is False and summary["cost_usd"] > 0
    assert set(summary["endpoints"]) == {*CANDS, "gen", "judge", "client"}
    assert summary["endpoints"]["cand-a"]["prompt_tokens"] > 0
    assert summary["cost_usd"] == pytest.approx(sum(e["cost_usd"] for e in summary["endpoints"].values()))


def test_incidents_were_met_and_retried(built):
    counts = built["counts"]
    assert counts["judge-429"] == 2 and counts["response-500"] == 2 and counts["judge-slow"] == 2
    assert "<unmatched>" not in counts
    calls = [json.loads(line) for line in (built["out"] / "calls.jsonl").read_text().splitlines()]
    statuses = [a.get("status") for c in calls for a in c["attempts"]]
    assert statuses.count(429) == 1 and statuses.count(500) == 1 and statuses.count(None) == 1  # the timeout
    assert not [c for c in calls if "error" in c]  # every call answered in the end
    # a state without incident makes exactly the calls of the pipeline; JSON steps ask for JSON, with a seed
    quiet = [c for c in calls if c["tag"].startswith(built["states"][2].state_id + "|")]
    kinds = [c["tag"].split("|")[1].split(":")[0] for c in quiet]
    assert {k: kinds.count(k) for k in PER_STATE} == PER_STATE
    for c, kind in zip(quiet, kinds):
        assert ("response_format" in c["request"]) == (kind in ("stage", "state", "strategy", "select"))
        assert ("seed" in c["request"]) == (kind not in ("select", "judge"))
    # s17: one valid candidate per step, so nothing to rate: no selection call
    assert not [c for c in calls if c["tag"].startswith(built["states"][17].state_id + "|select")]


def test_rerun_makes_no_call(built):
    assert built["again"].returncode == 0 and built["rerun_calls"] == 0
    assert "0 calls this run" in built["again"].stdout
    assert load_pairs(built["out"] / "pairs.jsonl")[0].provenance["chosen_trajectory"] == "high"


# ----------------------------------------------------------------------------- budget and resume


def bodies(llm) -> list[str]:
    return [json.dumps(c.body, sort_keys=True) for c in llm.requests]


def test_budget_stops_and_resume_repeats_no_call(tmp_path):
    states = pick_states(6)
    script = Script(states)
    with script.install(OpenAIDouble()) as llm:
        config = write_config(tmp_path, llm.base_url, states, concurrency=2, budget_usd=1.5)
        stopped = escrag("prefs", "build", "--config", str(config))
        first = bodies(llm)
        summary = json.loads((tmp_path / "out" / "summary.json").read_text())
        assert stopped.returncode == 3, stopped.stderr[-2000:]
        last = stopped.stderr.strip().splitlines()[-1]
        assert last.startswith("escrag prefs build: stopped at the budget of $1.50") and "pending" in last
        assert summary["stopped_by_budget"] and 0 < summary["cost_usd"] <= 1.5
        assert summary["states"]["pending"] > 0 and 0 < len(first) < 6 * sum(PER_STATE.values())
        assert (tmp_path / "out" / "pairs.jsonl").exists() and (tmp_path / "out" / "rejects.jsonl").exists()
        llm.reset()
        resumed = escrag("prefs", "build", "--config", str(config), "-o", "prefs.budget_usd=null")
        second = bodies(llm)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert not set(first) & set(second) and len(set(first + second)) == len(first + second)
    assert len(first) + len(second) == 6 * sum(PER_STATE.values())
    with script.install(OpenAIDouble()) as llm:  # the same build in one go
        whole = write_config(tmp_path / "whole", llm.base_url, states, concurrency=2)
        assert escrag("prefs", "build", "--config", str(whole)).returncode == 0
    assert (tmp_path / "out" / "pairs.jsonl").read_text() == (tmp_path / "whole" / "out" / "pairs.jsonl").read_text()
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["states"]["kept"] == 3  # s00, s01, s05


def test_failed_state_exits_1_and_rerun_retries_only_it(tmp_path):
    states = pick_states(3)
    script = Script(states)
    down = (all_of(TASKS["response"], r"\(s01\)"), [Reply.error(503)] * 8, "response")  # 2 calls x 4 attempts
    with script.install(OpenAIDouble(), {"down": down}) as llm:
        config = write_config(tmp_path, llm.base_url, states)
        failed = escrag("prefs", "build", "--config", str(config))
        assert failed.returncode == 1 and "1 states failed" in failed.stderr and "rerun to retry" in failed.stderr
        summary = json.loads((tmp_path / "out" / "summary.json").read_text())
        assert summary["states"]["failed"] == 1 and summary["states"]["kept"] == 1  # s00; s02 is not dominant
        llm.reset()
        again = escrag("prefs", "build", "--config", str(config))
        assert again.returncode == 0, again.stderr[-2000:]
        # only s01's two replies and their judgments: its reasoning was recorded before the 503s
        assert dict(llm.calls) == {"down": 2, "judge": 2}
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["states"]["kept"] == 2


# ----------------------------------------------------------------------------- consumers


def test_rm_trainer_and_index_builder_take_the_pairs_and_refuse_test_ones(built, tmp_path):
    from retriever_server.corpus import build_corpus
    from reward_server.train import train_reward_model

    pairs = built["out"] / "pairs.jsonl"
    cfg = load_config(ROOT / "configs/cpu-test.yaml", [f"reward.feature_cache={tmp_path / 'features'}",
                                                       "reward.epochs=1", "reward.heldout_fraction=0.2"])
    metrics = train_reward_model(cfg, pairs, tmp_path / "rm")
    assert metrics["n_train"] + metrics["n_heldout"] == 5
    chunks = build_corpus(load_config(), source="prefs", pairs=str(pairs))
    assert {c["response"] for c in chunks} == {p.chosen for p in load_pairs(pairs)}
    assert {tuple(c["strategies"]) for c in chunks} == {("Reflection of feelings",)}
    index = escrag("index", "build", "--source", "prefs", "--pairs", str(pairs), "--out", str(tmp_path / "ok"))
    assert index.returncode == 0, index.stderr[-2000:]
    manifest = json.loads((tmp_path / "ok" / "manifest.json").read_text())
    assert manifest["count"] == 5, manifest
    # a pair from the test split, by its provenance: both refuse it by name
    lines = pairs.read_text().splitlines()
    bad = json.loads(lines[1])
    bad["provenance"].update(split="test", dialogue_id="test-7")
    tainted = tmp_path / "tainted.jsonl"
    tainted.write_text("\n".join([lines[0], json.dumps(bad), *lines[2:]]) + "\n")
    with pytest.raises(DataError, match=rf"pair '{bad['id']}' comes from the test split 'test'.*reward-model"):
        train_reward_model(cfg, tainted, tmp_path / "rm2")
    with pytest.raises(DataError, match=rf"pair '{bad['id']}' comes from the test split 'test'.*retrieval index"):
        build_corpus(load_config(), source="prefs", pairs=str(tainted))
    index = escrag("index", "build", "--source", "prefs", "--pairs", str(tainted), "--out", str(tmp_path / "ix"))
    assert index.returncode == 2 and "comes from the test split" in index.stderr
    assert not (tmp_path / "rm2").exists() and not (tmp_path / "ix").exists()


def test_prompt_set_version_is_pinned():
    """The version is recorded in every pair's provenance: a sha256 over each prompt file's name and
    bytes, so it changes only when a prefs_v1 file does (then update this pin)."""
    assert PromptSet.load("prefs_v1").version == "prefs_v1@102effac894a"
    for name in ("prefs_v0", "judge_v1", "..", "prefs_v1/"):  # a template file, a path, not a set
        with pytest.raises(ConfigError, match=r"^prefs\.templates: no prompt set .* \(known: prefs_v1\)$"):
            PromptSet.load(name)
