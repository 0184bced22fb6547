"""The offline proxy's reward model is held out: a "training" RM is trained on silver pairs from some
ESConv train dialogues (its manifest records them), ``escrag eval proxy-rm`` trains the proxy RM on
other train dialogues only and records the set; the check passes for them and fails for an overlap,
for a test dialogue and for an unknown one. The proxy report then scores answers with the proxy RM
through a real reward server (scores equal a direct /score call), carries the "offline proxy, not the
paper's judge" label, and a rerun reads the scores from its cache without starting a server.
Run: .venv/bin/python -m pytest -q tests/test_proxy.py"""

import asyncio
import csv
import io
import json
import subprocess
import sys

import pytest

from escrag.config import load_config
from escrag.data import load_dialogues, load_states
from escrag.errors import UserError
from escrag.pairs import bootstrap_pairs, write_pairs
from escrag.web.procs import ServerProcess
from evaluation.proxy import LABEL, check_held_out, rm_dialogues, write_proxy_report
from evaluation.systems import validate
from reward_server.client import RewardClient
from reward_server.train import train_reward_model

TINY = ["reward.backbone=tiny-random:qwen2", "reward.max_pairs=24", "reward.epochs=2", "reward.batch_size=8",
        "reward.grad_accum=1", "reward.max_length=128"]


@pytest.fixture(scope="module")
def rms(tmp_path_factory, tiny_model):
    tmp = tmp_path_factory.mktemp("proxy")
    train_ids = sorted(d.dialogue_id for d in load_dialogues("train"))
    first = set(train_ids[:30])
    cfg = load_config("configs/cpu-test.yaml", TINY)
    write_pairs(bootstrap_pairs("train", 0, 24, dialogues=first), tmp / "train-pairs.jsonl")
    train_reward_model(cfg, tmp / "train-pairs.jsonl", tmp / "training-rm", log=lambda *_: None)
    res = subprocess.run([sys.executable, "-m", "escrag", "eval", "proxy-rm", "--config", "configs/cpu-test.yaml",
                          "--out", str(tmp / "proxy-rm"), *[a for o in TINY for a in ("-o", o)],
                          "-o", f"eval.proxy.training_rm_dir={tmp / 'training-rm'}",
                          "-o", "eval.proxy.train_dialogues=12"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    return tmp, first


def test_proxy_rm_dialogues_are_disjoint_train_dialogues(rms):
    tmp, first = rms
    training = rm_dialogues(tmp / "training-rm")
    assert training and training <= first
    proxy = rm_dialogues(tmp / "proxy-rm")
    recorded = json.loads((tmp / "proxy-rm" / "proxy.json").read_text())
    assert set(recorded["dialogue_ids"]) == proxy and len(proxy) <= 12 and recorded["label"] == LABEL
    assert not proxy & training
    test_ids = {d.dialogue_id for d in load_dialogues("test")}
    assert not (proxy | training) & test_ids and all(i.startswith("train-") for i in proxy | training)
    assert check_held_out(proxy, training) == {"proxy_dialogues": len(proxy), "training_dialogues": len(training)}


def test_held_out_check_fails_loudly():
    with pytest.raises(UserError, match="shares 1 dialogue"):
        check_held_out({"train-1", "train-2"}, {"train-2", "train-3"})
    with pytest.raises(UserError, match="not ESConv train dialogues.*test-5"):
        check_held_out({"train-1"}, {"test-5"})
    with pytest.raises(UserError, match="not ESConv train dialogues.*mine-1"):
        check_held_out({"mine-1"}, {"train-3"})


def test_proxy_report_scores_with_the_proxy_rm_and_caches(rms, tmp_path):
    tmp, _ = rms
    cfg = load_config("configs/cpu-test.yaml", [
        f"run.output_dir={tmp_path}", f"eval.proxy.rm_dir={tmp / 'proxy-rm'}",
        f"eval.proxy.training_rm_dir={tmp / 'training-rm'}",
        "eval.systems=[{name: plain, policy: p}, {name: rag, policy: p, rag: true, k: 2}]"])
    systems = validate(cfg)
    states = load_states("test")[:3]
    histories = {f"{s.dialogue_id}/{s.turn_index}": s.history for s in states}
    ex = [{"id": "x", "history": "Client: I feel alone since I moved to a new city",
           "response": "Moving somewhere new can make anyone feel isolated and unsure where to start"}]
    records = []
    for sid in histories:
        records.append({"state_id": sid, "system": "plain", "answer_key": f"p-{sid}", "format_ok": True,
                        "response": "I hear you. What has been hardest?", "exemplars": []})
        records.append({"state_id": sid, "system": "rag", "answer_key": f"r-{sid}", "format_ok": sid.endswith("0"),
                        "response": "Moving somewhere new can make anyone feel isolated and unsure. Tell me more.",
                        "exemplars": ex})
    cfg_file = tmp_path / "config.yaml"
    cfg_file.write_text("{}\n")
    said = []
    write_proxy_report(cfg, tmp_path, records, histories, systems, cfg_file, said.append)
    md = (tmp_path / "proxy.md").read_text()
    assert md.startswith(f"# {LABEL}") and "not the seven-metric LLM judge" in md
    assert any("scoring 6 answers" in s for s in said)
    rows = {line.split("|")[1].strip(): line for line in md.splitlines() if line.startswith("| plain") or
            line.startswith("| rag")}
    assert "| 100.0% |" in rows["rag"]  # the copy rate: every rag answer copies 8+ exemplar words
    server = ServerProcess("rm", ["reward", "--rm", str(tmp / "proxy-rm")], tmp_path)
    try:
        direct = asyncio.run(RewardClient(server.url).score(
            [{"history": histories[r["state_id"]], "output": r["response"]} for r in records]))["rm_scores"]
    finally:
        server.stop()
    text = (tmp_path / "proxy.csv").read_text()
    plain, rag = csv.DictReader(io.StringIO(text))
    assert plain["label_note"] == LABEL and rag["copy_rate"] == "1.0" and plain["copy_rate"] == ""
    assert float(plain["rm_score"]) == pytest.approx(sum(direct[0::2]) / 3, abs=1e-5)
    assert float(rag["rm_score"]) == pytest.approx(sum(direct[1::2]) / 3, abs=1e-5)
    said.clear()
    write_proxy_report(cfg, tmp_path, records, histories, systems, cfg_file, said.append)
    assert not said and (tmp_path / "proxy.csv").read_text() == text  # from the cache, no server
