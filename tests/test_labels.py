"""Rewards against ESConv's human labels (evaluation/labels.py): the statistics match a direct
computation, the items are held-out surveyed dialogues with a negative from another dialogue, and the
MiniLM proxy (the real packaged embedder) is fitted on train dialogues and refuses to be judged on them.

Run: .venv/bin/python -m pytest -q tests/test_labels.py"""

import numpy as np
import pytest
from scipy.stats import spearmanr

from escrag.config import load_config
from escrag.data import load_surveys
from escrag.errors import UserError
from evaluation.labels import (
    MiniLMProxy,
    check_disjoint,
    check_scorer,
    judge_answers,
    label_items,
    run_checks,
)


@pytest.fixture(scope="module")
def cfg():
    return load_config("configs/cpu-demo.yaml", ["eval.bootstrap=200"])


def test_items_are_surveyed_held_out_turns_with_another_dialogues_negative():
    items = label_items("test", 2, 0)
    surveys = load_surveys("test")
    assert {i["dialogue_id"] for i in items} <= set(surveys) and all(i["survey"] for i in items)
    assert all(i["dialogue_id"].startswith("test-") for i in items)
    gold_of = {}
    for i in items:
        gold_of.setdefault(i["gold"], set()).add(i["dialogue_id"])
    assert all(i["dialogue_id"] not in gold_of.get(i["other"], {i["dialogue_id"]}) for i in items)
    assert label_items("test", 2, 0) == items


def test_check_scorer_matches_a_direct_computation(cfg):
    items = label_items("test", 1, 0)  # one state per dialogue: a dialogue's score is its turn's score
    score = lambda pairs: [float(len(reply)) for _, reply in pairs]  # noqa: E731  a scorer with known values
    res = check_scorer(score, items, cfg)
    x = np.array([len(i["gold"]) for i in items], dtype=float)
    emp = np.array([i["survey"]["empathy"] for i in items])
    high, low = x[emp >= 5], x[emp <= 3]
    auc = np.mean([(h > lo) + 0.5 * (h == lo) for h in high for lo in low])
    assert res["empathy"]["pairwise_accuracy"][0] == pytest.approx(auc)
    assert res["empathy"]["high_dialogues"] == len(high) and res["empathy"]["low_dialogues"] == len(low)
    assert res["empathy"]["spearman"][0] == pytest.approx(spearmanr(x, emp).statistic)
    other = np.array([len(i["other"]) for i in items], dtype=float)
    assert res["other_dialogue"][0] == pytest.approx(np.mean((x > other) + 0.5 * (x == other)))
    for key in ("pairwise_accuracy", "spearman"):
        m, lo, hi = res["relevance"][key]
        assert lo <= m <= hi


def test_generic_share_matches_a_direct_computation(cfg, tmp_path):
    from evaluation.labels import read_replies

    items = label_items("test", 2, 0)
    path = tmp_path / "generic.txt"
    path.write_text("# a comment\nI see.\n\nThat sounds really very hard for you.\n")
    generic = read_replies(path)
    assert generic == ["I see.", "That sounds really very hard for you."]
    score = lambda pairs: [float(len(reply)) for _, reply in pairs]  # noqa: E731
    res = check_scorer(score, items, cfg, generic)
    ids = list(dict.fromkeys(i["dialogue_id"] for i in items))
    per = [np.mean([(len(g) > len(i["gold"])) + 0.5 * (len(g) == len(i["gold"])) for i in items
                    if i["dialogue_id"] == d for g in generic]) for d in ids]
    assert res["generic"][0] == pytest.approx(np.mean(per)) and res["generic"][1] <= res["generic"][0] <= res["generic"][2]
    assert "generic" not in check_scorer(score, items, cfg)


def test_minilm_proxy_fits_on_train_and_is_judged_on_other_dialogues(cfg):
    from escrag.embed import load_embedder

    fit = label_items("train", 1, 0, surveyed=False)[:80]
    proxy = MiniLMProxy(load_embedder(cfg.retriever.embedder), cfg).fit(fit)
    assert proxy.dialogues == {i["dialogue_id"] for i in fit} and all(d.startswith("train-") for d in proxy.dialogues)
    held = label_items("test", 1, 0)[:60]
    check_disjoint(proxy.dialogues, {i["dialogue_id"] for i in held})
    with pytest.raises(UserError, match="fitted on"):
        check_disjoint(proxy.dialogues, {fit[0]["dialogue_id"]})
    res = check_scorer(proxy.score, held, cfg)
    assert res["other_dialogue"][0] > 0.5  # it learned to tell a reply to this client from another's
    with pytest.raises(UserError, match="held-out"):
        run_checks(cfg, {}, "train")
    _judges_saved_answers(proxy, held, cfg)


def _judges_saved_answers(proxy, held, cfg):
    """--answers: the proxy's per-policy means and paired difference over a comparison's saved answers."""
    import json
    import tempfile

    from escrag.data import load_states

    sid = {(s.dialogue_id, s.target): s.state_id for s in load_states("test")}
    rows = [{"policy": p, "state_id": sid[(i["dialogue_id"], i["gold"])], "sample": 0,
             "response": i["gold"] if p == "a" else i["other"]} for p in ("a", "b") for i in held[:20]]
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as fh:
        fh.write("".join(json.dumps(r) + "\n" for r in rows))
    res = judge_answers(proxy, fh.name, cfg)
    gold = proxy.score([(i["history"], i["gold"]) for i in held[:20]])
    other = proxy.score([(i["history"], i["other"]) for i in held[:20]])
    assert res["a"][0] == pytest.approx(np.mean(gold)) and res["b"][0] == pytest.approx(np.mean(other))
    assert res["delta"][0] == pytest.approx(np.mean(other) - np.mean(gold)) and res["states"] == 20
