"""The two-stage episode (rollout/episode.py) through the vLLM engine, against real retriever and
reward server processes (a 40-chunk ESConv-train index, the ``length:8`` rule): with greedy decoding in
float32 on the tiny model of head size 32, every sample's record equals the transformers engine's token
for token — the stage-1 prompt, ĉ, the feedback built from the exemplars ĉ retrieved, c — with the
same action ranges, the loss mask on c only (on ĉ too with ``train_stage1``), the same exemplar ids
and the same reward parts; and each sampled (temperature 0.9) record is well formed on its own: ranges
inside the sequence, the feedback equal to the one rebuilt from its own exemplars.
Run: .venv-vllm/bin/python -m pytest -q tests/vllm_tier/test_vllm_episode.py   (~1 min)"""

import asyncio

import pytest
from conftest import serving

vllm = pytest.importorskip("vllm")

from escrag.config import load_config  # noqa: E402
from escrag.data import load_states  # noqa: E402
from retriever_server.client import RetrieverClient  # noqa: E402
from reward_server.client import RewardClient  # noqa: E402
from rollout.engines import make_engine  # noqa: E402
from rollout.episode import feedback_ids, prompt_ids, retrieval_query, run_group, stage1_messages  # noqa: E402

pytestmark = pytest.mark.vllm
RULE = "length:8"
TINY = "tiny-random:qwen2-hd32"
OVERRIDES = [f"policy.model={TINY}", "rollout.group_size=2", "rollout.max_new_tokens_stage1=10",
             "rollout.max_new_tokens_stage2=12", "rollout.torch_threads=1", "retriever.k=2", "rollout.dtype=float32",
             "rollout.vllm_kv_cache_gb=0.25", "rollout.vllm_enforce_eager=true", "rollout.max_seq_len=1024"]


def _cfg(*extra):
    return load_config("configs/cpu-test.yaml", [*OVERRIDES, *extra])


@pytest.fixture(scope="module")
def servers(tmp_path_factory, esconv_index):
    with serving(tmp_path_factory.mktemp("vllm-episode"), esconv_index, RULE) as urls:
        yield urls


@pytest.fixture(scope="module")
def engines():
    return {"vllm": make_engine(_cfg("rollout.engine=vllm")), "transformers": make_engine(_cfg())}


def _group(engine, servers, cfg, state, seed=1):
    async def go():
        return await run_group(state, engine, RetrieverClient(servers["retriever"]), RewardClient(servers["reward"]),
                               cfg, 3, seed)
    return asyncio.run(go())


def _record(sample):
    seq = sample.sequence
    return (seq.input_ids, seq.action_ranges, seq.loss_mask, sample.exemplar_ids, sample.initial_output, sample.output,
            sample.rm_score, sample.format_reward)


@pytest.mark.parametrize("stage1", [False, True])
def test_greedy_episodes_equal_the_transformers_engines(engines, servers, stage1):
    cfg = _cfg("rollout.temperature=0.0", f"rollout.train_stage1={str(stage1).lower()}")
    state = load_states("valid")[3]
    got = {name: _group(e, servers, cfg, state) for name, e in engines.items()}
    assert [_record(s) for s in got["vllm"].samples] == [_record(s) for s in got["transformers"].samples]
    for s in got["vllm"].samples:
        (a1, b1), (a2, b2) = s.sequence.action_ranges
        assert s.sequence.loss_mask == [0] * a1 + [int(stage1)] * (b1 - a1) + [0] * (a2 - b1) + [1] * (b2 - a2)
        assert len(s.exemplar_ids) == 2 and s.reward == pytest.approx(s.rm_score + s.format_reward)


def test_sampled_episodes_are_well_formed(engines, servers):
    cfg, state = _cfg(), load_states("valid")[5]
    engine = engines["vllm"]
    tok, msgs1 = engine.tokenizer, stage1_messages(state.history, cfg)
    group = _group(engine, servers, cfg, state, seed=11)
    p1 = prompt_ids(tok, msgs1)
    for s in group.samples:
        seq = s.sequence
        (a1, b1), (a2, b2) = seq.action_ranges
        assert seq.input_ids[:a1] == p1 and b2 == len(seq.input_ids) == len(seq.loss_mask)
        (exemplars,) = asyncio.run(RetrieverClient(servers["retriever"]).retrieve(
            [retrieval_query(s.initial_output, state.history)], k=2, exclude_dialogue_ids=[state.dialogue_id]))
        assert s.exemplar_ids == [e["id"] for e in exemplars]
        assert seq.input_ids[b1:a2] == feedback_ids(tok, msgs1, exemplars, seq.input_ids[b1 - 1] == tok.eos_token_id)
        assert len(seq.old_logprobs) == len(seq.input_ids) and all(x <= 0 for x in seq.old_logprobs[a2:b2])
