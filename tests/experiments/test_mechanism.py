"""The mechanism task (experiments/mechanism/): its rule reward (registered from the experiment), its
retrieval, and the job end to end (tiny).
Run: .venv/bin/python -m pytest -q tests/experiments/test_mechanism.py"""

from __future__ import annotations

import json

import pytest

from escrag.errors import UserError
from experiments.mechanism import task as mech
from experiments.mechanism.config import load
from reward_server.rules import parse_rule


def _history(topic: str) -> list[dict]:
    return [{"role": "user", "content": f"I can't stop worrying about my {topic}."}]


def test_rule_pays_only_for_the_exemplar_word():
    table, rule = mech.world(1), parse_rule("mechanism:1")
    other = next(c for c in mech.CODES if c != table["exam"])
    assert rule(_history("exam"), f"About your exam: {table['exam']}.") == 1.0
    assert rule(_history("exam"), f"About your exam: {other}.") == 0.0
    assert rule(_history("exam"), f"{table['exam']} {other}") == 0.0  # listing codes earns nothing
    assert rule(_history("exam"), "About your exam.") == 0.0
    assert rule(_history("dog"), table["exam"]) == float(table["dog"] == table["exam"])
    assert rule([{"role": "user", "content": "I feel sad."}], table["exam"]) == 0.0  # no topic: nothing pays


def test_held_out_worlds_are_derangements_of_train():
    mc = load("experiments/mechanism/mechanism.yaml").mechanism
    w = mech.worlds(mc)
    for split in ("valid", "test"):
        assert all(w[split][t] != w["train"][t] for t in mech.TOPICS)  # memorising train pays 0
    assert parse_rule(f"mechanism:{mc.test_world}/{mc.train_world}")(_history("car"), w["test"]["car"]) == 1.0
    s = mech.shuffled(w["train"], mc.shuffle_seed)
    assert all(s[t] != w["train"][t] for t in mech.TOPICS)
    assert not {x.history[0]["content"] for x in mech.states("train")} & {x.history[0]["content"] for x in mech.states("test")}


@pytest.mark.parametrize("spec", ["mechanism", "mechanism:x", "mechanism:1/2/3"])
def test_rule_rejects_bad_world(spec):
    with pytest.raises(UserError, match="world seed"):
        parse_rule(spec)


def test_only_a_draft_naming_the_topic_retrieves_its_exemplar():
    """With the real embedder and FAISS index: the draft that names the topic gets that topic's
    exemplar for every topic; the generic draft gets one fixed exemplar for all."""
    from escrag.embed import load_embedder
    from experiments.mechanism.job import LocalRetriever

    cfg = load("experiments/mechanism/mechanism.yaml")
    retr = LocalRetriever(cfg, load_embedder(cfg.retriever.embedder), mech.world(1), "w")
    named = retr.search([f"Tell me more about your {t}." for t in mech.TOPICS], 1)
    assert [h[0]["id"] for h in named] == [f"w-{t}" for t in mech.TOPICS]
    generic = retr.search([mech.GENERIC_DRAFT[1]] * 3, 1)
    assert len({h[0]["id"] for h in generic}) == 1


TINY = ["sft.max_steps=2", "sft.batch_size=2", "mechanism.sft_examples=4", "grpo.steps=1", "grpo.batch_states=2",
        "rollout.group_size=2", "rollout.max_new_tokens_stage1=8", "rollout.max_new_tokens_stage2=8",
        "mechanism.valid_states=2", "mechanism.test_states=3", "mechanism.eval_samples=1", "mechanism.seeds=[0,1]"]


def test_job_runs_end_to_end_and_resumes_from_its_parts(tmp_path):
    from escrag.config import ConfigError
    from experiments.mechanism.job import BASELINE, SYSTEMS, run, write_readme

    cfg = load("experiments/mechanism/mechanism.yaml", TINY + [f"run.output_dir={tmp_path}"])
    summary = run(cfg, tmp_path)
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["table"] == json.loads(json.dumps(summary["table"]))
    for split in ("valid", "test"):
        table = saved["table"][split]
        assert set(table) == set(SYSTEMS)
        for system, e in table.items():
            assert set(e["per_seed"]) == ({"None"} if system.startswith("sft") else {"0", "1"})
            assert all(0.0 <= v[0] <= 1.0 and v[1] <= v[0] <= v[2] for v in e["per_seed"].values())
            assert ("vs_" + BASELINE in e) == (system != BASELINE)
    answers = [json.loads(ln) for ln in (tmp_path / "answers.jsonl").read_text().splitlines()]
    assert len(answers) == (2 + 7 * 2) * (2 + 3)  # (2 SFT rows + 7 systems x 2 seeds) x (valid + test states)
    assert {a["system"] for a in answers} == set(SYSTEMS)
    for a in answers:  # the controls score a trained policy with the other index
        kind = "shuffled" if a["system"] in ("shuffled", "escrag-stage1>shuffled") else "true"
        assert all(f"{a['split']}-{kind}-" in e for e in a["exemplar_ids"]), a
    for e in saved["table"]["test"].values():  # intervals over the topics beside those over states
        lo, mean, hi = e["mean_over_topics"][1], e["mean_over_topics"][0], e["mean_over_topics"][2]
        assert lo <= mean <= hi and mean == pytest.approx(e["mean"][0])
    readme = write_readme(saved, tmp_path, "python -m experiments.mechanism.job -o x=1").read_text()
    assert "| escrag-stage1 |" in readme and "-o x=1" in readme and "Timings" in readme

    # a crash during the last arm: the rerun reads every finished part back and redoes only that one,
    # with the same answers bit for bit
    first = (tmp_path / "answers.jsonl").read_bytes()
    (tmp_path / "parts" / "arm-shuffled-1.json").unlink()
    logged = []
    run(cfg, tmp_path, log=logged.append)
    read_back = [ln for ln in logged if "read back" in ln]
    assert len(read_back) == 1 + 1 + 4 * 2 - 1, logged  # sft, its scores, every arm and seed but the lost one
    assert not any("arm-shuffled-1: read back" in ln for ln in logged) and any("shuffled, seed 1" in ln for ln in logged)
    assert (tmp_path / "answers.jsonl").read_bytes() == first
    with pytest.raises(ConfigError, match="another config"):
        run(load("experiments/mechanism/mechanism.yaml", TINY + [f"run.output_dir={tmp_path}", "grpo.lr=1.0e-4"]), tmp_path)
