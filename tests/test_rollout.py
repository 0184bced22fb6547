"""Two-stage rollouts on the tiny random Qwen2 against real retriever and reward servers (real
processes over sockets: a FAISS index over the first 40 chunks of ESConv valid, which the states under
test come from, and the ``length:8`` rule reward): the record is ``p1 + ĉ + feedback + c`` with the
feedback rebuilt from the retrieved exemplars, loss mask 1 on c only (on ĉ too with ``train_stage1``),
old log-probs equal a teacher-forced forward at the sampling temperature; reward parts equal the rule;
no exemplar ever comes from the state's own dialogue (while the same queries without the exclusion do
get them, and the state's own gold turn as a query finds its own chunk); ``rag: false`` shapes; seeded
groups reproduce exactly and do not depend on batching; concurrent groups share engine batches; and
the Ray pool: weights pushed to every worker, groups gathered in order, and a worker killed mid-batch
restarted, brought back to the latest weights and its states re-issued with no group lost or duplicated;
the crisis check's counts in a group's stats (every rollout of a high-risk state is high, none of an
ordinary one) become the step's ``risk_high_frac``, and the pool's workers compute them.
Run: .venv/bin/python -m pytest -q tests/test_rollout.py"""

import asyncio
import subprocess
import sys
import threading
import time

import pytest
import torch
from conftest import serving

from escrag.config import load_config
from escrag.data import load_states
from escrag.formats import format_reward, response_text
from retriever_server.client import RetrieverClient
from reward_server.client import RewardClient
from reward_server.rules import parse_rule
from rollout.engines.base import EngineScheduler
from rollout.engines.hf_engine import HFEngine
from rollout.episode import feedback_ids, prompt_ids, retrieval_query, run_group, run_groups, stage1_messages

RULE = "length:8"
OVERRIDES = ["rollout.group_size=3", "rollout.temperature=0.8", "rollout.max_new_tokens_stage1=10",
             "rollout.max_new_tokens_stage2=10", "rollout.torch_threads=1", "retriever.k=2"]


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """A retriever over the first 40 chunks of ESConv valid and a rule reward server, started once for
    this module (``escrag serve ...`` processes on loopback ports)."""
    tmp = tmp_path_factory.mktemp("rollout-servers")
    subprocess.run([sys.executable, "-m", "escrag", "index", "build", "--source", "esconv", "--out",
                    str(tmp / "index"), "--limit", "40", "-o", "data.train=valid"], check=True, capture_output=True)
    with serving(tmp, tmp / "index", RULE) as urls:
        yield urls


@pytest.fixture(scope="module")
def engine(tiny_model):
    torch.manual_seed(0)
    return HFEngine(tiny_model, _cfg().rollout, seed=0)


def _cfg(*extra):
    return load_config("configs/cpu-test.yaml", [*OVERRIDES, *extra])


def _group(state, engine, servers, cfg, version=5, seed=1):
    async def go():
        return await run_group(state, engine, RetrieverClient(servers["retriever"]),
                               RewardClient(servers["reward"]), cfg, version, seed)
    return asyncio.run(go())


def _teacher_forced(engine, ids, temperature):
    with torch.no_grad():
        logits = engine.model(torch.tensor([ids])).logits[0].float() / temperature
    return logits.log_softmax(-1)[:-1].gather(-1, torch.tensor(ids[1:])[:, None]).squeeze(-1)


def _check_logprobs(engine, seq, temperature):
    ref = _teacher_forced(engine, seq.input_ids, temperature)
    for a, b in seq.action_ranges:
        assert torch.allclose(torch.tensor(seq.old_logprobs[a:b]), ref[a - 1:b - 1], atol=1e-4)


def _retrieve(servers, queries, exclude=None):
    return asyncio.run(RetrieverClient(servers["retriever"]).retrieve(queries, k=2, exclude_dialogue_ids=exclude))


def test_two_stage_group_records(engine, servers):
    cfg, state = _cfg(), load_states("valid")[3]
    group = _group(state, engine, servers, cfg)
    assert group.state_id == f"{state.dialogue_id}/{state.turn_index}" and group.policy_version == 5
    assert len(group.samples) == 3
    assert {"stage1_s", "retrieve_s", "stage2_s", "reward_s", "stage1_tokens"} <= set(group.stats)
    tok, rule = engine.tokenizer, parse_rule(RULE)
    msgs1 = stage1_messages(state.history, cfg)
    p1 = prompt_ids(tok, msgs1)
    for s in group.samples:
        seq = s.sequence
        (a1, b1), (a2, b2) = seq.action_ranges
        assert seq.input_ids[:a1] == p1 and a1 == len(p1) and b2 == len(seq.input_ids)
        action1 = seq.input_ids[a1:b1]
        assert tok.decode(action1, skip_special_tokens=True).startswith(s.initial_output)
        (exemplars,) = _retrieve(servers, [retrieval_query(s.initial_output, state.history)], [state.dialogue_id])
        assert s.exemplar_ids == [e["id"] for e in exemplars] and len(exemplars) == 2
        ended = action1[-1] in engine.eos_ids
        assert seq.input_ids[b1:a2] == feedback_ids(tok, msgs1, exemplars, ended)
        assert seq.loss_mask == [0] * a2 + [1] * (b2 - a2)  # only c is trained
        _check_logprobs(engine, seq, cfg.rollout.temperature)
        assert tok.decode(seq.input_ids[a2:], skip_special_tokens=True).startswith(s.output)
        rm = rule(state.history, response_text(s.output))
        assert s.rm_score == pytest.approx(rm) and s.format_reward == format_reward(s.output)
        assert s.reward == pytest.approx(rm + s.format_reward)


def test_no_exemplar_from_the_states_own_dialogue(engine, servers):
    state = load_states("valid")[2]  # dialogue valid-1, which holds many of the index's 40 chunks
    own = f"{state.dialogue_id}/"
    client = RetrieverClient(servers["retriever"])
    (gold,) = asyncio.run(client.retrieve([state.target], k=3))  # the state's own gold turn as the query
    assert f"{own}{state.turn_index}" in [h["id"] for h in gold]
    (kept,) = asyncio.run(client.retrieve([state.target], k=3, exclude_dialogue_ids=[state.dialogue_id]))
    assert len(kept) == 3 and not any(h["id"].startswith(own) for h in kept)
    cfg = _cfg("rollout.group_size=4", "retriever.k=3")
    groups = [_group(state, engine, servers, cfg, seed=seed) for seed in range(3)]
    ids = [i for g in groups for s in g.samples for i in s.exemplar_ids]
    assert len(ids) == 36 and not any(i.startswith(own) for i in ids)
    queries = [retrieval_query(s.initial_output, state.history) for g in groups for s in g.samples]
    unfiltered = asyncio.run(RetrieverClient(servers["retriever"]).retrieve(queries, k=3))
    assert any(h["id"].startswith(own) for hits in unfiltered for h in hits)  # the exclusion did work


def test_one_stage_and_stage1_training(engine, servers):
    state = load_states("valid")[5]
    cfg = _cfg("rollout.rag=false")
    p1 = prompt_ids(engine.tokenizer, stage1_messages(state.history, cfg))
    for s in _group(state, engine, servers, cfg, version=0).samples:
        seq = s.sequence
        assert seq.input_ids[:len(p1)] == p1 and seq.action_ranges == [(len(p1), len(seq.input_ids))]
        assert seq.loss_mask == [0] * len(p1) + [1] * (len(seq.input_ids) - len(p1))
        _check_logprobs(engine, seq, cfg.rollout.temperature)
        assert s.initial_output == "" and s.exemplar_ids == []
    for s in _group(state, engine, servers, _cfg("rollout.train_stage1=true")).samples:
        (a1, b1), (a2, b2) = s.sequence.action_ranges
        want = [int(a1 <= t < b1 or a2 <= t < b2) for t in range(b2)]
        assert s.sequence.loss_mask == want and len(s.exemplar_ids) == 2  # ĉ and c, not the feedback


def test_seeded_groups_reproduce_and_ignore_batching(engine, servers):
    cfg, states = _cfg(), load_states("valid")[:3]
    alone = [_group(s, engine, servers, cfg, seed=10 + i) for i, s in enumerate(states)]
    sched = EngineScheduler(engine, max_batch=64)

    async def together():
        return await run_groups(states, sched, RetrieverClient(servers["retriever"]),
                                RewardClient(servers["reward"]), cfg, 5, [10, 11, 12])

    groups = asyncio.run(together())
    assert [g.state_id for g in groups] == [f"{s.dialogue_id}/{s.turn_index}" for s in states]
    assert sched.calls[0][0] == 9  # the three groups' stage-1 samples went out as one batch
    assert sum(rows for rows, _ in sched.calls) == 18 and len(sched.calls) <= 4
    for a, b in zip(alone, groups):  # the same draws, batched or not
        assert [s.sequence.input_ids for s in a.samples] == [s.sequence.input_ids for s in b.samples]
        assert [s.reward for s in a.samples] == [s.reward for s in b.samples]


# ------------------------------------------------------------------------------ Ray pool


def _uniform_logprob(engine):
    return -float(torch.log(torch.tensor(float(engine.model.config.vocab_size))))


def test_risk_metric_counts_high_risk_rollouts(engine, servers):
    from escrag.data import DialogueState
    from escrag.safety.classifier import RiskClassifier
    from trainer.learner import reward_metrics

    cfg = _cfg()
    risk = RiskClassifier.from_config(cfg)
    crisis = DialogueState("crisis", 2, [{"role": "user", "content": "I can't sleep."},
                                         {"role": "assistant", "content": "That sounds hard."},
                                         {"role": "user", "content": "I've saved up 40 pills and I'm taking them tonight."}])
    high = asyncio.run(run_groups([crisis, load_states("valid")[3]], engine, RetrieverClient(servers["retriever"]),
                                  RewardClient(servers["reward"]), cfg, 5, [1, 2], risk))
    assert high[0].stats["risk_high"] == 3 and high[1].stats["risk_high"] == 0
    assert all(g.stats["risk_s"] > 0 for g in high)  # the check's own time, one of GROUP_TIMES
    m = reward_metrics(high)
    assert m["risk_high_frac"] == pytest.approx(0.5) and 0.0 <= m["risk_elevated_frac"] <= 0.5
    assert "risk_high" not in _group(crisis, engine, servers, cfg).stats  # no classifier, no metric
    # safety.rollout_metric_samples: the check reads the first rollout of each group, the fractions are over those
    one = asyncio.run(run_groups([crisis, load_states("valid")[3]], engine, RetrieverClient(servers["retriever"]),
                                 RewardClient(servers["reward"]), _cfg("safety.rollout_metric_samples=1"), 5,
                                 [1, 2], risk))
    assert [(g.stats["risk_high"], g.stats["risk_checked"]) for g in one] == [(1, 1), (0, 1)]
    assert reward_metrics(one)["risk_high_frac"] == pytest.approx(0.5)


def test_pool_pushes_weights_and_survives_a_killed_worker(ray_session, servers, engine):
    import ray

    from rollout.pool import RolloutPool

    cfg = _cfg("rollout.num_workers=2", "rollout.worker_cpus=0.5", "rollout.max_new_tokens_stage1=24",
               "rollout.max_new_tokens_stage2=24", "safety.rollout_metric=true")
    pool = RolloutPool(cfg, servers["retriever"], servers["reward"])
    try:
        # final norm 0 -> flat logits: every old log-prob is -log V, visible proof the weights arrived
        pool.push_weights({"model.norm.weight": torch.zeros(64)}, version=1)
        assert pool.versions() == [1, 1]
        states = load_states("valid")[:4]
        seeds = [7, 8, 9, 10]
        want = [f"{s.dialogue_id}/{s.turn_index}" for s in states]
        victim = pool.workers[0]
        pid = ray.get(victim.stats.remote())["pid"]
        out = {}

        def run():
            try:
                out["groups"] = pool.generate(states, seeds)
            except Exception as exc:  # reported below, in the test's thread
                out["error"] = exc

        runner = threading.Thread(target=run)
        runner.start()
        deadline = time.time() + 120
        while ray.get(victim.stats.remote())["in_flight"] == 0 and time.time() < deadline:
            time.sleep(0.05)
        ray.kill(victim, no_restart=False)
        runner.join(300)
        assert "error" not in out, out.get("error")
        groups = out["groups"]
        assert pool.reissued >= 1
        assert [g.state_id for g in groups] == want  # none lost, none twice, input order
        assert all(g.policy_version == 1 for g in groups)
        assert ray.get(victim.stats.remote())["pid"] != pid  # Ray restarted it
        assert pool.versions() == [1, 1]
        lp = _uniform_logprob(engine)
        for g in groups:
            for s in g.samples:
                seq = s.sequence
                trained = [x for x, m in zip(seq.old_logprobs, seq.loss_mask) if m]
                assert trained == pytest.approx([lp] * len(trained), abs=1e-4)
        assert {g.stats["worker"] for g in groups} == {0, 1}
        assert all(g.stats["risk_high"] + g.stats["risk_elevated"] <= 3 for g in groups)  # safety.rollout_metric
    finally:
        pool.shutdown()
