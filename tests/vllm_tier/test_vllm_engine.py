"""The vLLM engine (rollout/engines/vllm_engine.py) on whatever vLLM this environment has: the CPU build
in `make test-vllm` (.venv-vllm), a CUDA build on a GPU machine. Token ids in, per-token log-probs that
equal a transformers teacher-forced forward in float32 (within 1e-4, the whole vocabulary: no top-k or
top-p cut, temperature 1), stop strings (kept in the token ids, cut from the text), seeded determinism
(a row's seed alone fixes its tokens, whatever else is in the batch), a weight load that really
changes what is generated and bumps the version, a stale version refused; the tiny model (head size
32: tiny-random:qwen2-hd32) and the packaged SmolLM2-135M. A config the installed vLLM cannot run
fails at load naming the key (tests/test_config.py has the case without vLLM).
Run: .venv-vllm/bin/python -m pytest -q tests/vllm_tier/test_vllm_engine.py   (~2 min)"""

import math

import pytest
import torch

vllm = pytest.importorskip("vllm")

from escrag.config import ConfigError, load_config  # noqa: E402
from escrag.models import load_causal_lm, load_tokenizer  # noqa: E402
from rollout.engines.base import SamplingParams, StaleWeightsError  # noqa: E402
from rollout.engines.vllm_engine import VLLMEngine, check_config, cpu_build  # noqa: E402

pytestmark = pytest.mark.vllm
TINY = "tiny-random:qwen2-hd32"
SMOLLM2 = "packaged:smollm2-135m-instruct"
FULL = dict(temperature=1.0, top_p=1.0, top_k=0, stop_strings=())  # log-softmax over the whole vocabulary


def _engine(spec: str) -> VLLMEngine:
    return VLLMEngine(spec, dtype="float32", seed=0, gpu_memory_utilization=0.3, max_model_len=1024,
                      kv_cache_gb=0.25, enforce_eager=True)


@pytest.fixture(scope="module")
def tiny():
    return _engine(TINY)


def _prompt(tok, text="I lost my job and feel awful."):
    msgs = [{"role": "user", "content": text}]
    return tok(tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True),
               add_special_tokens=False).input_ids


def _teacher_forced(spec: str, prompt: list[int], ids: list[int]) -> torch.Tensor:
    model = load_causal_lm(spec)
    with torch.no_grad():
        logp = model(torch.tensor([prompt + ids])).logits[0].float().log_softmax(-1)
    return logp[len(prompt) - 1:-1].gather(-1, torch.tensor(ids)[:, None]).squeeze(-1)


def test_logprobs_equal_a_transformers_forward_and_seeds_fix_each_row(tiny):
    prompt = _prompt(tiny.tokenizer)
    (gen,) = tiny.generate([prompt], SamplingParams(16, **FULL), seeds=[3])
    assert len(gen.token_ids) == len(gen.logprobs) == 16 and gen.finish_reason == "length"
    ref = _teacher_forced(TINY, prompt, gen.token_ids)
    assert torch.allclose(torch.tensor(gen.logprobs), ref, atol=1e-4), (gen.logprobs, ref.tolist())
    other = _prompt(tiny.tokenizer, "My sister stopped talking to me.")
    batch = tiny.generate([other, prompt, other], SamplingParams(16, **FULL), seeds=[1, 3, 2])
    assert batch[1].token_ids == gen.token_ids  # its seed alone fixes a row, not its batch
    assert batch[0].token_ids != batch[2].token_ids


def test_stop_strings_end_the_text_and_keep_the_tokens(tiny):
    """The same seed draws the same tokens up to a stop string taken from the middle of the free text;
    generation ends there, the text ends right after it, the tokens are a prefix of the free ones."""
    prompt = _prompt(tiny.tokenizer)
    (free,) = tiny.generate([prompt], SamplingParams(32, **FULL), seeds=[7])
    stop = next(w for w in free.text[len(free.text) // 3:].split() if len(w) >= 3 and w.isalpha())
    end = free.text.find(stop) + len(stop)
    (cut,) = tiny.generate([prompt], SamplingParams(32, **{**FULL, "stop_strings": (stop,)}), seeds=[7])
    assert cut.finish_reason == "stop" and not cut.ended_with_eos and cut.text == free.text[:end]
    assert cut.token_ids == free.token_ids[:len(cut.token_ids)] and len(cut.token_ids) < len(free.token_ids)


def test_load_weights_changes_what_is_generated_and_bumps_the_version(tiny):
    """Issue 52, finding 2: the tensors reached vLLM's worker as lists ('list' object has no attribute 'to')."""
    prompt, greedy = _prompt(tiny.tokenizer), SamplingParams(6, temperature=0.0, top_p=1.0, top_k=0, stop_strings=())
    (before,) = tiny.generate([prompt], greedy)
    norm = load_causal_lm(TINY).model.norm.weight.detach().clone()
    tiny.load_weights({"model.norm.weight": torch.zeros_like(norm)}, version=1)
    (flat,) = tiny.generate([prompt], greedy)
    assert tiny.version == 1
    assert flat.logprobs == pytest.approx([-math.log(len(tiny.tokenizer))] * 6, abs=1e-4)  # every logit 0
    with pytest.raises(StaleWeightsError):
        tiny.load_weights({"model.norm.weight": norm}, version=1)
    tiny.load_weights({"model.norm.weight": norm}, version=2)
    (after,) = tiny.generate([prompt], greedy)
    assert after.token_ids == before.token_ids and tiny.version == 2


def test_smollm2_logprobs_equal_a_transformers_forward():
    engine = _engine(SMOLLM2)
    prompt = _prompt(engine.tokenizer)
    (gen,) = engine.generate([prompt], SamplingParams(12, **FULL), seeds=[5])
    ref = _teacher_forced(SMOLLM2, prompt, gen.token_ids)
    assert torch.allclose(torch.tensor(gen.logprobs), ref, atol=1e-4), (gen.logprobs, ref.tolist())
    (stopped,) = engine.generate([prompt], SamplingParams(40, temperature=0.0, top_p=1.0, top_k=0, stop_strings=("you",)))
    assert stopped.finish_reason == "stop" and stopped.text.endswith("you") and not stopped.ended_with_eos


@pytest.mark.skipif(not cpu_build(), reason="the head sizes and dtypes of vLLM's CPU build")
def test_a_config_the_cpu_build_cannot_run_fails_at_load_naming_the_key():
    cfg = ["rollout.engine=vllm", "rollout.dtype=float32"]
    check_config(load_config("configs/cpu-test.yaml", [*cfg, f"policy.model={TINY}"]))  # runs: no error
    with pytest.raises(ConfigError, match=r"policy.model: tiny-random:qwen2 has attention heads of 16"):
        check_config(load_config("configs/cpu-test.yaml", [*cfg, "policy.model=tiny-random:qwen2"]))
    with pytest.raises(ConfigError, match=r"rollout.dtype: vLLM's CPU build runs float32 or bfloat16, got 'float16'"):
        check_config(load_config("configs/cpu-test.yaml", ["rollout.engine=vllm", "rollout.dtype=float16",
                                                           f"policy.model={TINY}"]))
    assert load_tokenizer(TINY) is not None


def test_a_learners_weights_reach_every_layer_and_the_tied_head(tiny):
    """What a learner pushes: ``named_parameters``, which name the tied LM head once, as the embedding.
    After the push the engine's log-probs equal the pushed model's forward (the head had kept the old
    embedding: a 0.8 nat gap)."""
    model = load_causal_lm(TINY)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    tiny.load_weights({n: p.detach().clone() for n, p in model.named_parameters()}, version=tiny.version + 1)
    prompt = _prompt(tiny.tokenizer)
    (gen,) = tiny.generate([prompt], SamplingParams(12, **FULL), seeds=[4])
    with torch.no_grad():
        logp = model(torch.tensor([prompt + gen.token_ids])).logits[0].float().log_softmax(-1)
    ref = logp[len(prompt) - 1:-1].gather(-1, torch.tensor(gen.token_ids)[:, None]).squeeze(-1)
    assert torch.allclose(torch.tensor(gen.logprobs), ref, atol=1e-4), (gen.logprobs, ref.tolist())
