"""The issue's full evaluation: two systems (the embedded SmolLM2 through the counselor API, without and
with RAG over a real ESConv exemplar index) on 10 sampled test states, judged by the scripted judge
(a real HTTP server speaking OpenAI's chat protocol, ``tests/openai_double.py``) that answers from a
per-state table and, for five states, answers malformed JSON once (one repair call), 429 with
Retry-After, 500, slower than the judge's timeout, and malformed JSON for good (counted, not fatal).
``escrag eval --config`` runs as a command; the calls counted at the double match the script, Table 1
holds the means of the table's scores over the validly judged states; the rerun makes zero calls (at
the double and to any counselor: no server is started); a run with no judge writes only the offline
proxy report, under its label.
Run: .venv/bin/python -m pytest -q tests/test_eval_smollm2.py"""

import csv
import json
import re
import subprocess
import sys

import pytest
import yaml
from openai_double import OpenAIDouble, Reply

from escrag.config import load_config
from escrag.pairs import METRICS
from evaluation.states import sample_states

SPECIAL = ("repair_once", "rate_limited", "server_error", "too_slow", "malformed")


def table_scores(i: int) -> dict:
    return {m: 1 + (3 * i + j) % 10 for j, m in enumerate(METRICS)}


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    out = tmp_path_factory.mktemp("smol") / "index"
    subprocess.run([sys.executable, "-m", "escrag", "index", "build", "--source", "esconv", "--out", str(out),
                    "--limit", "200"], check=True, capture_output=True)
    return out


def eval_config(tmp_path, index, judge_url: str | None) -> dict:
    cfg = yaml.safe_load(open("configs/cpu-demo.yaml"))
    cfg["run"].update(output_dir=str(tmp_path / "run"), seed=3, server_timeout_s=300)
    cfg["data"]["max_history_turns"] = 4
    cfg["retriever"].update(index_dir=str(index), k=2)
    cfg["rollout"].update(max_new_tokens_stage1=24, max_new_tokens_stage2=32, torch_threads=2)
    cfg["eval"] = {"states": 10, "bootstrap": 200, "concurrency": 10,
                   "systems": [{"name": "smol", "label": "SmolLM2-135M", "policy": "packaged:smollm2-135m-instruct"},
                               {"name": "smol-rag", "label": "SmolLM2-135M with RAG",
                                "policy": "packaged:smollm2-135m-instruct", "rag": True}]}
    if judge_url:
        cfg["endpoints"] = {"judge": {"base_url": judge_url, "model": "judge-double", "timeout_s": 1.0,
                                      "retries": 3, "backoff_s": 0.1, "price_input_per_m": 1.0,
                                      "price_output_per_m": 4.0}}
        cfg["judge"] = {"endpoint": "judge"}
    path = tmp_path / ("eval.yaml" if judge_url else "eval-nojudge.yaml")
    path.write_text(yaml.safe_dump(cfg))
    return path


def script(llm: OpenAIDouble, states) -> dict:
    """One rule per state, matched on its last client turn (the judge prompt puts it right before
    </conversation>); five states misbehave."""
    kinds = {}
    for i, s in enumerate(states):
        tail = re.escape(s.history[-1]["content"].strip()[-60:])
        good = Reply.json(table_scores(i))
        kind = SPECIAL[i] if i < len(SPECIAL) else "normal"
        queue = {"repair_once": [Reply("Scores: EI=8, NE=7")], "rate_limited": [Reply.error(429, retry_after=0.3)],
                 "server_error": [Reply.error(500)], "too_slow": [Reply.json(table_scores(i), delay_s=1.6)]}
        default = Reply('{"EI": 9}') if kind == "malformed" else good
        llm.on(s.state_id, tail + r"\n</conversation>", queue.get(kind, []), default=default)
        kinds[s.state_id] = (i, kind)
    return kinds


def escrag_eval(config) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "escrag", "eval", "--config", str(config)],
                          capture_output=True, text=True, timeout=900)


@pytest.mark.slow
def test_full_evaluation_two_smollm2_systems(tmp_path, index):
    with OpenAIDouble() as llm:
        config = eval_config(tmp_path, index, llm.base_url)
        states = sample_states(load_config(config))
        assert len(states) == 10 and all(s.dialogue_id.startswith("test-") for s in states)
        kinds = script(llm, states)
        res = escrag_eval(config)
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
        run = tmp_path / "run"
        per_state = [json.loads(x) for x in (run / "per_state.jsonl").read_text().splitlines()]
        assert len(per_state) == 20 and {r["system"] for r in per_state} == {"smol", "smol-rag"}
        rag = [r for r in per_state if r["system"] == "smol-rag"]
        assert all(len(r["exemplars"]) == 2 and r["initial"] for r in rag)
        assert all(not r["exemplars"] for r in per_state if r["system"] == "smol")

        # calls at the double: one per distinct (state, response), plus the script's extras
        distinct = {sid: len({r["response"].strip() for r in per_state if r["state_id"] == sid}) for sid in kinds}
        extra = {"repair_once": 1, "rate_limited": 1, "server_error": 1, "too_slow": 1}
        for sid, (_, kind) in kinds.items():
            want = distinct[sid] * (2 if kind == "malformed" else 1) + extra.get(kind, 0)
            assert llm.calls[sid] == want, (sid, kind, dict(llm.calls))
        summary = json.loads((run / "summary.json").read_text())
        j = summary["judge"]
        assert (j["repaired"], j["failed"]) == (1, 0) and j["malformed"] == distinct[states[4].state_id]
        calls = summary["calls"]["judge:judge"]
        assert calls["attempts"] == llm.total and calls["calls"] == llm.total - 3  # 429, 500, timeout retried
        assert summary["cost_this_run"] > 0 and "calls=" in res.stderr and "cost=$" in res.stderr

        # Table 1: means of the scripted scores over the validly judged states
        rows = {r["system"]: r for r in csv.DictReader((run / "table1.csv").open())}
        for name in ("smol", "smol-rag"):
            valid = [i for sid, (i, kind) in kinds.items() if kind != "malformed"]
            for m in METRICS:
                assert float(rows[name][m]) == pytest.approx(sum(table_scores(i)[m] for i in valid) / 9, abs=1e-4)
            assert int(rows[name]["n"]) == 9 and int(rows[name]["malformed"]) == 1
            assert float(rows[name]["EI_lo"]) <= float(rows[name]["EI"]) <= float(rows[name]["EI_hi"])
        md = (run / "table1.md").read_text()
        assert "SmolLM2-135M with RAG" in md and "judge_v1@" in md and "Client: EI" in md
        assert (run / "proxy.md").read_text().startswith("# Offline proxy, not the paper's judge")
        assert "Offline proxy" not in md

        # the rerun makes no call: not to the judge, not to a counselor (none is started)
        llm.reset()
        logs = sorted(p.stat().st_mtime_ns for p in (run / "logs").iterdir())
        res = escrag_eval(config)
        assert res.returncode == 0, res.stderr[-3000:]
        assert llm.total == 0 and json.loads((run / "summary.json").read_text())["calls_made"] == 0
        assert sorted(p.stat().st_mtime_ns for p in (run / "logs").iterdir()) == logs
        assert [json.loads(x) for x in (run / "per_state.jsonl").read_text().splitlines()] == per_state

    # no judge endpoint: the offline proxy report only, from the cached answers
    res = escrag_eval(eval_config(tmp_path, index, None))
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert "judge" not in summary and summary["calls_made"] == 0
    assert summary["outputs"] == ["per_state.jsonl", "proxy.md", "proxy.csv"]
    proxy = {r["system"]: r for r in csv.DictReader((tmp_path / "run" / "proxy.csv").open())}
    assert proxy["smol"]["copy_rate"] == "" and proxy["smol-rag"]["copy_rate"] != ""
    assert float(proxy["smol"]["mean_words"]) > 0
