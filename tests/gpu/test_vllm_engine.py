"""The vLLM engine on a GPU: token ids, raw log-probs that match a transformers teacher-forced forward,
stop strings, seeded determinism and a versioned weight load through vLLM's public RLHF path
(worker extension + collective_rpc). Skips itself without CUDA or without vllm.
Run (on a GPU machine with vllm): .venv/bin/python -m pytest -q tests/gpu/test_vllm_engine.py"""

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
vllm = pytest.importorskip("vllm")

from rollout.engines.base import SamplingParams, StaleWeightsError  # noqa: E402


@pytest.fixture(scope="module")
def engine(tiny_model):
    from rollout.engines.vllm_engine import VLLMEngine

    return VLLMEngine(tiny_model, dtype="float32", gpu_memory_utilization=0.3, max_model_len=1024)


def _prompt(tok):
    msgs = [{"role": "user", "content": "I lost my job and feel awful."}]
    return tok(tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True),
               add_special_tokens=False).input_ids


def test_generate_logprobs_match_transformers(engine, tiny_model):
    from escrag.models import load_causal_lm

    prompt = _prompt(engine.tokenizer)
    (gen,) = engine.generate([prompt], SamplingParams(12, temperature=1.0, top_k=20, seed=3, stop_strings=()))
    assert len(gen.token_ids) == len(gen.logprobs) > 0
    model = load_causal_lm(tiny_model)
    with torch.no_grad():
        logp = model(torch.tensor([prompt + gen.token_ids])).logits[0].float().log_softmax(-1)
    ref = logp[len(prompt) - 1:-1].gather(-1, torch.tensor(gen.token_ids)[:, None]).squeeze(-1)
    assert torch.allclose(torch.tensor(gen.logprobs), ref, atol=2e-3)
    again = engine.generate([prompt], SamplingParams(12, temperature=1.0, top_k=20, seed=3, stop_strings=()))
    assert again[0].token_ids == gen.token_ids


def test_load_weights_takes_effect(engine):
    prompt = _prompt(engine.tokenizer)
    engine.load_weights({"model.norm.weight": torch.zeros(64)}, version=1)
    (gen,) = engine.generate([prompt], SamplingParams(6, temperature=0.0, stop_strings=()))
    vocab = len(engine.tokenizer)
    assert engine.version == 1
    assert gen.logprobs == pytest.approx([-float(torch.log(torch.tensor(float(vocab))))] * 6, abs=1e-2)
    with pytest.raises(StaleWeightsError):
        engine.load_weights({"model.norm.weight": torch.ones(64)}, version=1)
