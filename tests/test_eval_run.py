"""Evaluation runs on the tiny random policy (fast): eval-config checks name the bad key; three RAG
policy systems (k = 2, 3, 4) through real counselor and retriever processes, and an OpenAI-compatible
endpoint (the scripted double, a real HTTP server) as a baseline called directly without RAG and
through the counselor's --endpoint mode with RAG; the same double judges, with scores that are a
function of the judged reply, so Table 1, Table 2 (Δ Avg) and the Figure 3 plot are checked against
means recomputed from per_state.jsonl. Each RAG answer carries k exemplars and the endpoint's stage 2
saw them; seeds and prices reach the endpoint; a rerun makes no call; another model behind one
system re-answers that system only, and identical replies are not judged again. Every answer gets the
crisis check's level (``answer_risk``) and each system its count of high / elevated answers; a high-risk
conversation's answers are all counted high.
Run: .venv/bin/python -m pytest -q tests/test_eval_run.py"""

import csv
import json
import re
import subprocess
import sys

import pytest
import yaml
from openai_double import OpenAIDouble, Reply

from escrag.config import ConfigError, load_config
from escrag.pairs import METRICS
from escrag.prompts import COUNSELOR_ROLE, FEEDBACK_INSTRUCTION
from escrag.seeds import derive_seed
from evaluation.run import run_eval
from evaluation.states import sample_states
from evaluation.systems import by_counselor, counselor_args, validate

SYSTEMS = [{"name": f"rag{k}", "label": f"tiny k={k}", "policy": "tiny-random:qwen2", "rag": True, "k": k}
           for k in (2, 3, 4)] + [{"name": "api", "label": "API model", "endpoint": "api"},
                                  {"name": "api-rag", "label": "API model with RAG", "endpoint": "api", "rag": True}]


def api_answer(stage: int):
    """The baseline endpoint: a formatted answer whose length depends on the client's last turn."""
    def content(body: dict) -> str:
        last = [m["content"] for m in body["messages"] if m["role"] == "user"][-1]
        words = " ".join(["yes"] * (len(last.split()) % 7 + 2 + stage))
        return f"<think>stage {stage}</think><response>[api stage {stage}] {words}</response>"
    return Reply(content=content)


def reply_scores(reply: str) -> dict:
    """The scripted judge's table: scores from the judged reply's word count."""
    n = len(reply.split())
    return {m: 1 + (n + j) % 10 for j, m in enumerate(METRICS)}


def judge_answer(body: dict) -> str:
    text = body["messages"][1]["content"]
    reply = re.search(r"<reply>\n(.*)\n</reply>", text, re.DOTALL).group(1)
    return json.dumps(reply_scores(reply))


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    out = tmp_path_factory.mktemp("evalrun") / "index"
    subprocess.run([sys.executable, "-m", "escrag", "index", "build", "--source", "esconv", "--out", str(out),
                    "--limit", "60"], check=True, capture_output=True)
    return out


def base(tmp_path, **extra) -> list[str]:
    over = [f"run.output_dir={tmp_path / 'run'}", "eval.states=5", "eval.bootstrap=100",
            "rollout.max_new_tokens_stage1=8", "rollout.max_new_tokens_stage2=12", "rollout.torch_threads=1"]
    return over + [f"{k}={v}" for k, v in extra.items()]


@pytest.mark.parametrize("systems,extra,needle", [
    ("[{name: a, policy: p}, {name: a, policy: q}]", {}, "eval.systems[1].name: duplicate system name 'a'"),
    ("[{name: a, policy: p, endpoint: e}]", {}, "eval.systems[0]: give exactly one of policy and endpoint"),
    ("[{name: a, endpoint: nope}]", {}, "eval.systems[0].endpoint: no endpoint 'nope'"),
    ("[{name: a, policy: p}]", {"eval.table2": "[{label: x, system: b}]"}, "eval.table2[0].system: no system 'b'"),
    ("[{name: a, policy: p, rag: true}]", {"eval.k_sweep": "[a]"}, "eval.k_sweep: RAG systems, each with its own k"),
    ("[{name: a, policy: p}]", {"judge.endpoint": "j"}, "judge.endpoint: no endpoint 'j'"),
    ("[]", {}, "eval.systems: at least one system"),
])
def test_config_checks_name_the_key(tmp_path, systems, extra, needle):
    cfg = load_config(None, base(tmp_path, **{"eval.systems": systems, **extra}))
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    assert needle in str(err.value)


def test_systems_one_counselor_serves_run_one_after_another():
    """A k-sweep's systems share a counselor (same policy, RAG and overrides; k goes with each request),
    wherever they stand in the config; a system with other overrides or without RAG needs its own."""
    systems = [{"name": "a2", "policy": "p", "rag": True, "k": 2}, {"name": "api", "endpoint": "e"},
               {"name": "a4", "policy": "p", "rag": True, "k": 4}, {"name": "b", "policy": "p"},
               {"name": "a3", "policy": "p", "rag": True}, {"name": "hot", "policy": "p", "rag": True, "k": 2,
                                                           "overrides": ["rollout.temperature=1.2"]}]
    cfg = load_config(None, [f"eval.systems={json.dumps(systems)}",
                             'endpoints={"e": {"base_url": "http://127.0.0.1:9", "model": "m"}}'])
    named = {s.name: s for s in cfg.eval.systems}
    assert by_counselor(cfg, named) == ["a2", "a4", "a3", "api", "b", "hot"]
    assert counselor_args(cfg, named["api"]) is None and counselor_args(cfg, named["a2"]) == ["--policy", "p"]
    assert counselor_args(cfg, named["b"]) == ["--policy", "p", "--no-rag"]


def test_train_and_valid_are_refused(tmp_path):
    for split in ("train", "valid"):
        with pytest.raises(ConfigError, match="data.test: evaluation runs on held-out test states"):
            sample_states(load_config(None, [f"data.test={split}"]))
    states = sample_states(load_config(None, ["eval.states=7", "run.seed=5"]))
    assert len(states) == 7 and states == sample_states(load_config(None, ["eval.states=7", "run.seed=5"]))
    assert all(s.dialogue_id.startswith("test-") for s in states)


def write_config(tmp_path, index, judge_url, systems) -> str:
    cfg = yaml.safe_load(open("configs/cpu-test.yaml"))
    cfg["run"]["output_dir"] = str(tmp_path / "run")
    cfg["retriever"] = {"index_dir": str(index)}
    cfg["rollout"].update(max_new_tokens_stage1=8, max_new_tokens_stage2=12, torch_threads=1)
    cfg["endpoints"] = {"judge": {"base_url": judge_url, "model": "judge-double", "timeout_s": 5},
                        "api": {"base_url": judge_url, "model": "api-double", "price_input_per_m": 3.0,
                                "price_output_per_m": 6.0},
                        "api-b": {"base_url": judge_url, "model": "api-double-b"}}
    cfg["judge"] = {"endpoint": "judge"}
    cfg["safety"] = {"backbone": None}  # answer risk by layers 1-4 here; the backbone's has its own test below
    cfg["eval"] = {"states": 5, "bootstrap": 100, "systems": systems,
                   "table2": [{"label": "k=2", "system": "rag2"}, {"label": "k=4", "system": "rag4"}],
                   "k_sweep": ["rag2", "rag3", "rag4"]}
    path = tmp_path / "eval.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def test_rag_systems_k_sweep_tables_and_cache(tmp_path, index):
    with OpenAIDouble(fallback=Reply(content=judge_answer)) as llm:
        llm.on("api-stage2", FEEDBACK_INSTRUCTION[:60], default=api_answer(2))
        llm.on("api-stage1", COUNSELOR_ROLE[:60], default=api_answer(1))
        path = write_config(tmp_path, index, llm.base_url, SYSTEMS)
        cfg = load_config(path)
        summary = run_eval(cfg)
        run = tmp_path / "run"
        per_state = [json.loads(x) for x in (run / "per_state.jsonl").read_text().splitlines()]
        assert len(per_state) == 25 and summary["answers"]["rag3"] == {"ok": 5, "failed": 0}
        assert all(r["answer_risk"] in ("none", "elevated", "high") for r in per_state)
        assert summary["risk"]["rag3"]["n"] == 5 and set(summary["risk"]) == {"api", "api-rag", "rag2", "rag3", "rag4"}
        for r in per_state:
            k = {"api": 0, "api-rag": cfg.retriever.k, "rag2": 2, "rag3": 3, "rag4": 4}[r["system"]]
            assert len(r["exemplars"]) == k and r["judge"]["valid"]
            assert r["judge"]["scores"] == reply_scores(r["response"].strip())
        assert llm.calls["<unmatched>"] == len({(r["state_id"], r["response"].strip()) for r in per_state})

        # the endpoint baseline: one stage directly, two stages (with the exemplars) behind the counselor
        api = [r for r in per_state if r["system"] == "api"]
        api_rag = [r for r in per_state if r["system"] == "api-rag"]
        assert all(r["format_ok"] and r["response"].startswith("[api stage 1]") and not r["initial"] for r in api)
        assert all(r["response"].startswith("[api stage 2]") and r["initial"].startswith("[api stage 1]")
                   for r in api_rag)
        assert llm.calls["api-stage1"] == 10 and llm.calls["api-stage2"] == 5
        stage2 = [c.body for c in llm.requests if c.key == "api-stage2"]
        assert all(b["messages"][-1]["content"].count("[Exemplar") == cfg.retriever.k for b in stage2)
        assert all(b["messages"][-2]["role"] == "assistant" for b in stage2)  # ĉ, then the feedback turn
        direct = [c.body for c in llm.requests if c.key == "api-stage1" and c.body["messages"][-1]["role"] == "user"]
        sid = api[0]["state_id"]
        assert any(b["seed"] == derive_seed(derive_seed(cfg.run.seed, sid), 1) for b in direct)
        assert summary["calls"]["system:api"]["cost"] > 0 and summary["calls"]["system:api-rag"]["cost"] > 0

        rows = {r["system"]: r for r in csv.DictReader((run / "table1.csv").open())}
        for name in ("rag2", "rag3", "rag4", "api", "api-rag"):
            mine = [reply_scores(r["response"].strip()) for r in per_state if r["system"] == name]
            for m in METRICS:
                assert float(rows[name][m]) == pytest.approx(sum(s[m] for s in mine) / 5, abs=1e-4)
            avg = sum(sum(s.values()) / 7 for s in mine) / 5
            assert float(rows[name]["Avg"]) == pytest.approx(avg, abs=1e-4)
        t2 = (run / "table2.md").read_text()
        k4 = next(line for line in t2.splitlines() if line.startswith("| k=4"))
        delta = float(rows["rag4"]["Avg"]) - float(rows["rag2"]["Avg"])
        assert f"| {delta:+.2f} |" in k4
        assert (run / "figure3.png").read_bytes()[:4] == b"\x89PNG"
        # one counselor for the k-sweep's three systems (k per request), one for the endpoint with RAG
        assert sorted(p.name for p in (run / "logs").glob("counselor-*.log")) == ["counselor-api-rag.log",
                                                                                "counselor-rag2.log"]
        assert summary["outputs"] == ["per_state.jsonl", "table1.md", "table1.csv", "table2.md", "table2.csv",
                                      "figure3.png", "proxy.md", "proxy.csv"]

        llm.reset()
        again = run_eval(load_config(path))
        assert llm.total == 0 and again["calls_made"] == 0

        # another model behind one system: only that system answers again; its replies are the same
        # texts, so the judge's cache (keyed by history and reply) answers without a call
        changed = [dict(s, endpoint="api-b") if s["name"] == "api" else s for s in SYSTEMS]
        third = run_eval(load_config(write_config(tmp_path, index, llm.base_url, changed)))
        assert set(third["calls"]) == {"system:api"} and third["calls"]["system:api"]["calls"] == 5
        assert llm.total == llm.calls["api-stage1"] == 5
        assert {c.body["model"] for c in llm.requests} == {"api-double-b"}


def test_answer_risk_counts_high_and_elevated_answers_per_system():
    from escrag.safety.classifier import RiskClassifier
    from evaluation.run import answer_risk

    histories = {"crisis/1": [{"role": "user", "content": "My husband held a knife to my throat an hour ago."}],
                 "plain/1": [{"role": "user", "content": "My exam went fine, I'm just tired."}]}
    records = [{"state_id": sid, "system": name, "response": "I hear you. Tell me more."}
               for sid in histories for name in ("a", "b")]
    found = answer_risk(records, histories, ["a", "b"], RiskClassifier.from_config(load_config("configs/cpu-test.yaml")))
    assert [r["answer_risk"] for r in records] == ["high", "high", "none", "none"]
    assert found["a"] == {"n": 2, "high": 1, "elevated": 0, "high_frac": 0.5, "elevated_frac": 0.0}
