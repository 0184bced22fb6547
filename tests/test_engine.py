"""The transformers generation engine on the tiny random Qwen2: left-padded batching gives the same
tokens and log-probs as one prompt alone, log-probs equal a teacher-forced forward at the sampling
temperature, a row's draw depends only on its seed (not on the rest of the batch), top-k/top-p truncate
as specified, stop strings and EOS end a row (kept in the completion), versioned partial weight loads
take effect and reject bad input, and the scheduler merges concurrent requests into one batch.
Run: .venv/bin/python -m pytest -q tests/test_engine.py"""

import asyncio

import pytest
import torch

from escrag.config import load_config
from escrag.prompts import render, stage1_messages
from escrag.sampling import sample
from rollout.engines.base import EngineScheduler, SamplingParams, StaleWeightsError
from rollout.engines.hf_engine import HFEngine

pytestmark = pytest.mark.unit


def params(n, temperature, top_p=1.0, top_k=0, stop_strings=()):
    return SamplingParams(n, temperature, top_p, top_k, stop_strings)


GREEDY = params(12, 0.0)
RO = load_config("configs/cpu-test.yaml").rollout  # float32, compile off


@pytest.fixture(scope="module")
def engine(tiny_model):
    return HFEngine(tiny_model, RO, seed=0)


def _prompt(tok, text: str) -> list[int]:
    return tok(render(tok, stage1_messages([{"role": "user", "content": text}])),
               add_special_tokens=False).input_ids


@pytest.fixture(scope="module")
def prompts(engine):
    tok = engine.tokenizer
    return [_prompt(tok, "I lost my job."), _prompt(tok, "My partner left me last week and I can't "
                                                         "stop crying, everything feels pointless now.")]


def _teacher_forced(engine, prompt, completion, temperature=1.0):
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logp = (engine.model(ids).logits[0].float() / temperature).log_softmax(-1)
    return logp[len(prompt) - 1:-1].gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)


def test_left_padded_batch_matches_single_prompt(engine, prompts):
    short, long = prompts
    assert len(short) < len(long)
    alone = engine.generate([short], GREEDY)[0]
    batched = engine.generate([long, short], GREEDY)[1]
    assert batched.token_ids == alone.token_ids
    assert batched.logprobs == pytest.approx(alone.logprobs, abs=1e-4)
    assert len(alone.token_ids) == 12 and alone.finish_reason == "length"


def test_logprobs_are_at_the_sampling_temperature(engine, prompts):
    for prompt, gen in zip(prompts, engine.generate(prompts, params(10, 0.7, 0.9, 20), seeds=[1, 2])):
        ref = _teacher_forced(engine, prompt, gen.token_ids, temperature=0.7)
        assert torch.allclose(torch.tensor(gen.logprobs), ref, atol=1e-4)


def test_a_rows_draw_depends_only_on_its_seed(engine, prompts):
    p = params(16, 1.0)
    a = engine.generate(prompts, p, seeds=[7, 9])
    assert [g.token_ids for g in a] == [g.token_ids for g in engine.generate(prompts, p, seeds=[7, 9])]
    assert a[0].token_ids != engine.generate(prompts[:1], p, seeds=[8])[0].token_ids
    # the same row alone, in another position, or beside other rows draws the same tokens
    alone = engine.generate(prompts[1:], p, seeds=[9])[0]
    crowd = engine.generate([prompts[0], prompts[0], prompts[1]], p, seeds=[3, 4, 9])[2]
    assert alone.token_ids == crowd.token_ids == a[1].token_ids


def test_top_k_one_is_greedy(engine, prompts):
    greedy = engine.generate(prompts, GREEDY)
    topk1 = engine.generate(prompts, params(12, 1.3, top_k=1), seeds=[3, 4])
    assert [g.token_ids for g in greedy] == [g.token_ids for g in topk1]


def test_sampler_truncates_to_top_p_inside_top_k():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log().repeat(4000, 1)
    seeds, steps = torch.arange(4000), torch.zeros(4000, dtype=torch.long)
    tok, logp = sample(logits, 1.0, 0.7, 0, seeds, steps)
    counts = torch.bincount(tok, minlength=4).float() / len(tok)
    assert counts[2] == 0 and counts[3] == 0  # outside the top-p nucleus
    assert counts[0] == pytest.approx(0.5 / 0.8, abs=0.03)
    assert torch.allclose(logp, probs.log()[tok])  # full-vocabulary log-probs, not the renormalised ones
    tok, _ = sample(logits, 1.0, 1.0, 3, seeds, steps)
    assert set(tok.tolist()) == {0, 1, 2}


def test_stop_string_ends_the_row_after_it(engine, prompts):
    full = engine.generate([prompts[1]], params(24, 0.0))[0]
    assert len(full.text) > 6, full.text
    stop = full.text[3:6]
    cut = engine.generate([prompts[1]], params(24, 0.0, stop_strings=(stop,)))[0]
    assert cut.finish_reason == "stop"
    assert cut.text == full.text[:full.text.index(stop) + len(stop)]
    assert cut.token_ids == full.token_ids[:len(cut.token_ids)] and len(cut.token_ids) < 24


def test_eos_is_kept_and_stops(tiny_model, prompts):
    eng = HFEngine(tiny_model, RO)
    full = eng.generate([prompts[0]], GREEDY)[0]
    eng.eos_ids = {full.token_ids[3]}  # pretend the 4th greedy token is the EOS
    first = full.token_ids.index(full.token_ids[3])
    cut = eng.generate([prompts[0]], GREEDY)[0]
    assert cut.token_ids == full.token_ids[:first + 1] and cut.finish_reason == "stop" and cut.ended_with_eos


def test_load_weights_partial_versioned_and_validated(tiny_model, prompts):
    eng = HFEngine(tiny_model, RO)
    before = {k: v.clone() for k, v in eng.model.state_dict().items()}
    vocab = eng.model.config.vocab_size
    with pytest.raises(KeyError, match="unknown parameter"):
        eng.load_weights({"model.norm.weight": torch.zeros(64), "nope.weight": torch.zeros(1)}, 1)
    with pytest.raises(ValueError, match="shape"):
        eng.load_weights({"model.norm.weight": torch.zeros(3)}, 1)
    assert eng.version == 0 and torch.equal(eng.model.model.norm.weight, before["model.norm.weight"])
    eng.load_weights({"model.norm.weight": torch.zeros(64)}, version=1)  # final norm 0 -> flat logits
    assert eng.version == 1
    gen = eng.generate([prompts[0]], GREEDY)[0]
    assert gen.logprobs == pytest.approx([-torch.log(torch.tensor(float(vocab))).item()] * 12, abs=1e-4)
    after = eng.model.state_dict()
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert changed == ["model.norm.weight"]
    with pytest.raises(StaleWeightsError):
        eng.load_weights({"model.norm.weight": before["model.norm.weight"]}, version=1)


def test_scheduler_merges_concurrent_requests(engine, prompts):
    sched = EngineScheduler(engine, max_batch=8)

    async def both():
        return await asyncio.gather(sched.generate([prompts[0]], GREEDY),
                                    sched.generate([prompts[1]] * 2, GREEDY),
                                    sched.generate([prompts[0]], params(4, 0.0)))

    a, b, c = asyncio.run(both())
    assert [rows for rows, _ in sched.calls] == [3, 1]  # equal params share one call
    assert a[0].token_ids == engine.generate([prompts[0]], GREEDY)[0].token_ids
    assert b[0].token_ids == b[1].token_ids and len(c[0].token_ids) <= 4
