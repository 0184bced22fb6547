"""Two-stage rollouts on the tiny random Qwen2 against real retriever and reward servers (real
processes over sockets: a 40-chunk ESConv FAISS index, and the ``length:8`` rule reward):
record contents and masks (stage-2 prompt = the prompt rebuilt from the retrieved exemplars,
completion-only loss mask, old log-probs equal a teacher-forced forward), reward parts equal the rule,
``rag: false`` and ``train_stage1`` shapes, concurrent groups sharing engine batches, and the Ray pool:
weights pushed to every worker, groups gathered in order, and a worker killed mid-batch restarted,
brought back to the latest weights and its states re-issued with no group lost or duplicated.
Run: .venv/bin/python -m pytest -q tests/test_rollout.py"""

import asyncio
import subprocess
import sys
import threading
import time

import pytest
import torch

from escrag.config import load_config
from escrag.data import load_states
from escrag.formats import format_reward, response_text
from escrag.prompts import stage1_messages, stage2_messages
from escrag.servers import ServerProcess
from retriever_server.client import RetrieverClient
from reward_server.client import RewardClient
from reward_server.rules import parse_rule
from rollout.engine import EngineScheduler
from rollout.episode import prompt_ids, retrieval_query, run_group, run_groups
from rollout.hf_engine import HFEngine

RULE = "length:8"
OVERRIDES = ["rollout.group_size=3", "rollout.temperature=1.0", "rollout.max_new_tokens_stage1=10",
             "rollout.max_new_tokens_stage2=10", "rollout.torch_threads=1", "retriever.k=2"]


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """A retriever over a 40-chunk index and a rule reward server, started once for this module with
    the same helpers as conftest's ``serve`` (``escrag serve ...`` processes on loopback ports)."""
    tmp = tmp_path_factory.mktemp("rollout-servers")
    subprocess.run([sys.executable, "-m", "escrag", "index", "build", "--source", "esconv", "--out",
                    str(tmp / "index"), "--limit", "40"], check=True, capture_output=True)
    servers = [ServerProcess("retriever", ["retriever", "--index", str(tmp / "index")], tmp, None),
               ServerProcess("reward", ["reward", "--rule", RULE], tmp, None)]
    try:
        yield {s.name: s.wait(180).url for s in servers}
    finally:
        for s in servers:
            s.stop()


@pytest.fixture(scope="module")
def engine(tiny_model):
    torch.manual_seed(0)
    return HFEngine(tiny_model, seed=0)


def _cfg(*extra):
    return load_config("configs/cpu-test.yaml", [*OVERRIDES, *extra])


def _group(state, engine, servers, cfg, version=5):
    async def go():
        return await run_group(state, engine, RetrieverClient(servers["retriever"]),
                               RewardClient(servers["reward"]), cfg, version)
    return asyncio.run(go())


def _teacher_forced(engine, ids, n_prompt):
    with torch.no_grad():
        logp = engine.model(torch.tensor([ids])).logits[0].float().log_softmax(-1)
    return logp[n_prompt - 1:-1].gather(-1, torch.tensor(ids[n_prompt:])[:, None]).squeeze(-1)


def _check_sequence(engine, seq, prompt, stage):
    n = len(prompt)
    assert seq.stage == stage and seq.input_ids[:n] == prompt and len(seq.input_ids) > n
    assert seq.loss_mask == [0] * n + [1] * (len(seq.input_ids) - n)
    assert seq.old_logprobs[:n] == [0.0] * n
    ref = _teacher_forced(engine, seq.input_ids, n)
    assert torch.allclose(torch.tensor(seq.old_logprobs[n:]), ref, atol=1e-4)


def test_two_stage_group_records(engine, servers):
    cfg, state = _cfg(), load_states("valid")[3]
    group = _group(state, engine, servers, cfg)
    assert group.state_id == f"{state.dialogue_id}/{state.turn_index}" and group.policy_version == 5
    assert len(group.samples) == 3
    assert {"stage1_s", "retrieve_s", "stage2_s", "reward_s", "stage1_tokens"} <= set(group.stats)
    tok, rule = engine.tokenizer, parse_rule(RULE)
    retriever = RetrieverClient(servers["retriever"])
    for s in group.samples:
        (seq,) = s.sequences
        exemplars = asyncio.run(retriever.retrieve([retrieval_query(s.initial_output, state.history)], k=2))[0]
        assert s.exemplar_ids == [e["id"] for e in exemplars] and len(exemplars) == 2
        p2 = prompt_ids(tok, stage2_messages(state.history, response_text(s.initial_output), exemplars,
                                             cfg.data.max_history_turns))
        _check_sequence(engine, seq, p2, stage=2)
        assert tok.decode(seq.input_ids[len(p2):], skip_special_tokens=True).startswith(s.output)
        rm = rule(state.history, response_text(s.output))
        assert s.rm_score == pytest.approx(rm) and s.format_reward == format_reward(s.output)
        assert s.reward == pytest.approx(rm + s.format_reward)


def test_one_stage_and_stage1_training(engine, servers):
    state = load_states("valid")[5]
    p1 = prompt_ids(engine.tokenizer, stage1_messages(state.history, 4))
    vanilla = _group(state, engine, servers, _cfg("rollout.rag=false"), version=0)
    for s in vanilla.samples:
        (seq,) = s.sequences
        _check_sequence(engine, seq, p1, stage=1)
        assert s.initial_output == "" and s.exemplar_ids == []
    both = _group(state, engine, servers, _cfg("rollout.train_stage1=true"))
    for s in both.samples:
        s1, s2 = s.sequences
        _check_sequence(engine, s1, p1, stage=1)
        assert engine.tokenizer.decode(s1.input_ids[len(p1):], skip_special_tokens=True).startswith(
            s.initial_output)
        assert s2.stage == 2 and s2.loss_mask[-1] == 1 and len(s.exemplar_ids) == 2


def test_concurrent_groups_share_engine_batches(engine, servers):
    cfg, states = _cfg(), load_states("valid")[:3]
    sched = EngineScheduler(engine, max_batch=64)

    async def go():
        return await run_groups(states, sched, RetrieverClient(servers["retriever"]),
                                RewardClient(servers["reward"]), cfg, 2)

    groups = asyncio.run(go())
    assert [g.state_id for g in groups] == [f"{s.dialogue_id}/{s.turn_index}" for s in states]
    assert sched.calls[0][0] == 9  # the three groups' stage-1 samples went out as one batch
    assert sum(rows for rows, _ in sched.calls) == 18 and len(sched.calls) <= 4


# ------------------------------------------------------------------------------ Ray pool


def _uniform_logprob(engine):
    return -float(torch.log(torch.tensor(float(engine.model.config.vocab_size))))


def test_pool_pushes_weights_and_survives_a_killed_worker(ray_session, servers, engine):
    import ray

    from rollout.pool import RolloutPool

    cfg = _cfg("rollout.num_workers=2", "rollout.worker_cpus=0.5", "rollout.max_new_tokens_stage1=24",
               "rollout.max_new_tokens_stage2=24")
    pool = RolloutPool(cfg, servers["retriever"], servers["reward"])
    try:
        # final norm 0 -> flat logits: every old log-prob is -log V, visible proof the weights arrived
        pool.push_weights({"model.norm.weight": torch.zeros(64)}, version=1)
        assert pool.versions() == [1, 1]
        states = load_states("valid")[:4]
        want = [f"{s.dialogue_id}/{s.turn_index}" for s in states]
        victim = pool.workers[0]
        pid = ray.get(victim.stats.remote())["pid"]
        out = {}

        def run():
            try:
                out["groups"] = pool.generate(states)
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
                seq = s.sequences[0]
                trained = [x for x, m in zip(seq.old_logprobs, seq.loss_mask) if m]
                assert trained == pytest.approx([lp] * len(trained), abs=1e-4)
        assert {g.stats["worker"] for g in groups} == {0, 1}
    finally:
        pool.shutdown()
