"""Evaluation runs on the tiny random policy (fast): eval-config checks name the bad key; three RAG
systems (k = 2, 3, 4) through real counselor and retriever processes, judged by the scripted judge
(a real HTTP server) whose scores are a function of the judged reply, so Table 1, Table 2 (Δ Avg) and
the Figure 3 plot are checked against means recomputed from per_state.jsonl; each RAG answer carries
k exemplars; a rerun makes no call; changing one system's k re-answers that system only.
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
from evaluation.run import run_eval
from evaluation.states import sample_states
from evaluation.systems import validate

SYSTEMS = [{"name": f"rag{k}", "label": f"tiny k={k}", "policy": "tiny-random:qwen2", "rag": True, "k": k}
           for k in (2, 3, 4)]


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
    cfg["endpoints"] = {"judge": {"base_url": judge_url, "model": "judge-double", "timeout_s": 5}}
    cfg["judge"] = {"endpoint": "judge"}
    cfg["eval"] = {"states": 5, "bootstrap": 100, "systems": systems,
                   "table2": [{"label": "k=2", "system": "rag2"}, {"label": "k=4", "system": "rag4"}],
                   "k_sweep": ["rag2", "rag3", "rag4"]}
    path = tmp_path / "eval.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def test_rag_systems_k_sweep_tables_and_cache(tmp_path, index):
    with OpenAIDouble(fallback=Reply(content=judge_answer)) as llm:
        path = write_config(tmp_path, index, llm.base_url, SYSTEMS)
        summary = run_eval(load_config(path))
        run = tmp_path / "run"
        per_state = [json.loads(x) for x in (run / "per_state.jsonl").read_text().splitlines()]
        assert len(per_state) == 15 and summary["answers"]["rag3"] == {"ok": 5, "failed": 0}
        for r in per_state:
            assert len(r["exemplars"]) == int(r["system"][-1]) and r["judge"]["valid"]
            assert r["judge"]["scores"] == reply_scores(r["response"].strip())
        assert llm.total == len({(r["state_id"], r["response"].strip()) for r in per_state})

        rows = {r["system"]: r for r in csv.DictReader((run / "table1.csv").open())}
        for name in ("rag2", "rag3", "rag4"):
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
        assert summary["outputs"] == ["per_state.jsonl", "table1.md", "table1.csv", "table2.md", "table2.csv",
                                      "figure3.png", "proxy.md", "proxy.csv"]

        llm.reset()
        again = run_eval(load_config(path))
        assert llm.total == 0 and again["calls_made"] == 0

        # a new k for one system: only that system answers again (and only its new answers are judged)
        changed = [dict(s, k=5) if s["name"] == "rag4" else s for s in SYSTEMS]
        third = run_eval(load_config(write_config(tmp_path, index, llm.base_url, changed)))
        assert set(third["calls"]) == {"system:rag4", "judge:judge"}
        assert third["calls"]["system:rag4"]["calls"] == 5 and llm.total <= 5
        per_state = [json.loads(x) for x in (run / "per_state.jsonl").read_text().splitlines()]
        assert all(len(r["exemplars"]) == 5 for r in per_state if r["system"] == "rag4")
