"""experiments/strategy_claim: the go / no-go vote, the held-out states kept apart from the corpus and
the training states, and the decision rule read off a summary."""

import pytest

from experiments.strategy_claim.config import load
from experiments.strategy_claim.gonogo import vote

CONFIG = "experiments/strategy_claim/config.yaml"


def test_vote_is_the_majority_label_and_ties_go_to_the_better_ranked_hit():
    hits = [{"strategies": ["Question"]}, {"strategies": ["Reflection of feelings", "Question"]},
            {"strategies": ["Reflection of feelings"]}]
    assert vote(hits) == "Question"  # 2 votes each: Question comes first in rank order
    assert vote(hits[1:]) == "Reflection of feelings"
    assert vote([{"strategies": []}]) == ""


def test_held_out_states_are_fixed_by_the_seed_and_never_in_the_corpus_or_training():
    from escrag.data import load_states
    from experiments.strategy_claim.job import eval_jobs
    from retriever_server.corpus import build_corpus

    cfg = load(CONFIG)
    jobs = {split: eval_jobs(cfg, split) for split in ("valid", "test")}
    assert [len(jobs["valid"]), len(jobs["test"])] == [cfg.claim.valid_states, cfg.claim.test_states]
    assert [s.state_id for s, _ in eval_jobs(cfg, "test")] == [s.state_id for s, _ in jobs["test"]]
    held = {s.target for split in jobs for s, _ in jobs[split] if len(s.target) > 40}  # by content, not by name
    corpus = {c["response"] for c in build_corpus(cfg)}
    train = {s.target for s in load_states(cfg.data.train)}
    assert len(held) > 100 and not held & corpus and not held & train


def test_the_decision_rule_needs_both_conditions():
    from experiments.strategy_claim.job import decision

    def arm(vs_base, vs_sft):
        return {"vs_vanilla+rag": {"states": vs_base, "dialogues": vs_base}, "vs_sft+rag": {"states": vs_sft}}

    good = {"escrag": arm([0.1, 0.02, 0.2], [0.05, 0, 0]), "escrag-stage1": arm([0.1, 0.0, 0.2], [0.01, 0, 0])}
    assert decision(good)["claim_holds"]
    crossing = {**good, "escrag": arm([0.1, -0.01, 0.2], [0.05, 0, 0])}
    assert not decision(crossing)["claim_holds"] and not decision(crossing)["escrag_vs_vanilla_rag_clear_of_0"]
    below = {**good, "escrag-stage1": arm([0.1, 0.02, 0.2], [-0.01, 0, 0])}
    assert not decision(below)["claim_holds"] and decision(below)["escrag_vs_vanilla_rag_clear_of_0"]


@pytest.mark.parametrize("split", ["valid", "test"])
def test_the_scoring_rule_knows_every_held_out_state(split):
    from experiments.strategy_claim.job import StrategyReward, eval_jobs

    reward = StrategyReward(split)
    for s, _ in eval_jobs(load(CONFIG), split):
        reward.rule.check(s.history)


def test_the_sft_start_rule_takes_the_fewest_steps_within_005_of_the_best():
    from experiments.strategy_claim.sft_valid import choose

    rows = [{"name": "a", "steps": 16, "exactly_one": 0.10}, {"name": "b", "steps": 64, "exactly_one": 0.62},
            {"name": "c", "steps": 128, "exactly_one": 0.66}]
    assert choose(rows) == "b"
    rows[1]["exactly_one"] = 0.60
    assert choose(rows) == "c"
