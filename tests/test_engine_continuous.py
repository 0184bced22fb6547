"""The fast transformers engine on the tiny random Qwen2 (compile off except in the one compile test):

- the sampled distribution: under fixed logits fed through the engine's own prefill and decode
  paths, token frequencies pass a chi-square test against the exact truncated distribution
  (temperature, top-k, then top-p inside it), and fail it for a wrong top-p or temperature;
- continuous batching: seeded rows draw the same tokens alone or joining a running batch mid-decode,
  through the sync call and the async front; finished rows leave the batch (each decode row-step
  yields a token of a live row);
- the prefix cache: a prompt that extends a finished row (a stage-2 prompt) reuses its K/V and gets
  the tokens and log-probs of a full prefill;
- the slot forward equals HF's forward (logits); bfloat16 log-probs stay within a stated tolerance of
  a float32 teacher-forced forward, and follow in-place weight loads (oneDNN-packed linears on a CPU);
  max_seq_len ends a row and rejects longer prompts;
- under torch.compile (engines compiling a decode step; the prefill is eager): float32 draws exactly
  the eager tokens (the sampler in the graph is the eager one), also for rows joining mid-decode, and
  an in-place load (a packed linear, a fused q/k/v one, the tied head) is seen by the compiled graph
  and the packed copies; bfloat16 matches the model's own forward and sees the load too (in
  `make test` where bf16 is native, else in `make test-all`);
- a failing prefill pass fails its requests (no caller waits forever) and the engine goes on.
Run: .venv/bin/python -m pytest -q tests/test_engine_continuous.py"""

import asyncio
import threading
import time

import pytest
import torch

from escrag.config import load_config
from escrag.models import fast_bfloat16
from rollout.engines import decoder
from rollout.engines.base import SamplingParams
from rollout.engines.decoder import cpu_packing
from rollout.engines.hf_engine import HFEngine

RO = load_config("configs/cpu-test.yaml").rollout  # float32, compile off
PROMPTS = [[1, 504, 2088, 314, 253, 1345, 28, 940, 446], [1, 9519, 28, 940, 446, 2], [1, 77, 78, 79, 80]]


def _ro(**changes):
    ro = load_config("configs/cpu-test.yaml").rollout
    for k, v in changes.items():
        setattr(ro, k, v)
    return ro


def params(n, temperature=1.0, top_p=1.0, top_k=0):
    return SamplingParams(n, temperature, top_p, top_k, ())


@pytest.fixture(scope="module")
def engine(tiny_model):
    return HFEngine(tiny_model, RO, seed=0)


def _teacher_forced(model, prompt, completion, temperature=1.0):
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logp = (model(ids).logits[0].float() / temperature).log_softmax(-1)
    return logp[len(prompt) - 1:-1].gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)


# ------------------------------------------------------------------ the sampled distribution

Z = [2.0, 1.7, 1.5, 1.3, 1.0, 0.8, 0.5, 0.3, 0.0, -0.4, -0.8, -1.2]  # the support's logits
TOKENS = [4071, 12, 977, 30001, 5, 2222, 16000, 803, 45000, 77, 9999, 310]  # where they sit in the vocab
CHI2_LIMIT = 25.74  # scipy.stats.chi2.ppf(1 - 1e-4, df=5): 6 tokens survive T 0.7, top-k 10, top-p 0.9


def truncated(temperature, top_p, top_k) -> dict[int, float]:
    """The documented distribution, computed independently of escrag.sampling."""
    order = sorted(range(len(Z)), key=lambda i: -Z[i])[:top_k]
    weights = [torch.tensor(Z[i] / temperature).exp().item() for i in order]
    probs = [w / sum(weights) for w in weights]
    kept, mass = [], 0.0
    for i, p in zip(order, probs):
        if mass >= top_p:
            break
        kept.append((i, p))
        mass += p
    return {TOKENS[i]: p / mass for i, p in kept}


def chi2(counts: dict[int, int], probs: dict[int, float]) -> float:
    n = sum(counts.values())
    if set(counts) - set(probs):
        return float("inf")  # a draw the distribution cannot make
    return sum((counts.get(t, 0) - n * p) ** 2 / (n * p) for t, p in probs.items())


class FixedLogits(torch.nn.Module):
    """Stands in for the LM head: the same logits for every row and position."""

    def __init__(self, logits: torch.Tensor):
        super().__init__()
        self.register_buffer("logits", logits)

    def forward(self, hidden):
        return self.logits.to(hidden.dtype).expand(*hidden.shape[:-1], -1)


def test_sampled_frequencies_follow_the_truncated_distribution(tiny_model):
    eng = HFEngine(tiny_model, _ro(max_batch=256, max_seq_len=16), seed=0)
    vocab = eng.model.config.vocab_size
    logits = torch.full((vocab,), -30.0)
    logits[TOKENS] = torch.tensor(Z)
    eng.model.lm_head = FixedLogits(logits)
    rows, steps = 3000, 4  # step 0 is drawn after the prefill, steps 1-3 inside the decode step
    gens = eng.generate([[1, 2, 3]] * rows, params(steps, 0.7, 0.9, 10), seeds=list(range(rows)))
    counts: dict[int, int] = {}
    for g in gens:
        assert len(g.token_ids) == steps
        for t in g.token_ids:
            counts[t] = counts.get(t, 0) + 1
    want = truncated(0.7, 0.9, 10)
    assert len(want) == 6 and set(counts) <= set(want)  # nothing outside the nucleus is ever drawn
    assert chi2(counts, want) < CHI2_LIMIT, (counts, want)
    for wrong in [(0.7, 0.8, 10), (0.7, 1.0, 10), (1.0, 0.9, 10), (0.8, 0.9, 10), (0.7, 0.9, 5)]:
        assert chi2(counts, truncated(*wrong)) > CHI2_LIMIT, wrong  # the test can tell them apart
    full = (logits / 0.7).log_softmax(-1)
    for g in gens[:20]:  # the recorded log-prob is the full-vocabulary one at the temperature
        assert g.logprobs == pytest.approx(full[g.token_ids].tolist(), abs=1e-5)


# ------------------------------------------------------------------ continuous batching


def test_rows_joining_mid_decode_draw_what_they_draw_alone(engine):
    a_params, b_params = params(40), params(12)
    alone_a = engine.generate(PROMPTS[:2], a_params, seeds=[5, 6])
    alone_b = engine.generate(PROMPTS[2:], b_params, seeds=[7])
    joined_before = engine.stats["joined_running"]
    done = threading.Event()
    req_a = engine.submit(PROMPTS[:2], a_params, [5, 6], done.set)
    start = engine.stats["steps"]
    while engine.stats["steps"] < start + 5:  # A is decoding; B enters its batch
        time.sleep(0.001)
    gen_b = engine.generate(PROMPTS[2:], b_params, seeds=[7])
    done.wait()
    assert engine.stats["joined_running"] > joined_before
    assert [g.token_ids for g in req_a.result()] == [g.token_ids for g in alone_a]
    assert gen_b[0].token_ids == alone_b[0].token_ids
    assert gen_b[0].logprobs == pytest.approx(alone_b[0].logprobs, abs=1e-5)


def test_engine_thread_runs_calls_and_ends_with_the_engine(tiny_model):
    import gc

    own = HFEngine(tiny_model, RO, seed=0)
    thread = own.call(threading.current_thread)
    assert thread is not threading.current_thread() and thread.name == "hf-engine"
    with pytest.raises(ZeroDivisionError):  # a call's error reaches the caller; the thread goes on
        own.call(lambda: 1 / 0)
    assert own.generate([PROMPTS[0]], params(3), seeds=[1])[0].token_ids
    del own
    gc.collect()
    thread.join(timeout=5)  # it held the engine only while working
    assert not thread.is_alive()
    closed = HFEngine(tiny_model, RO, seed=0)
    closed.close()
    with pytest.raises(RuntimeError, match="closed"):
        closed.generate([PROMPTS[0]], params(3), seeds=[1])


def test_rows_entering_together_share_one_prefill_pass(engine):
    prompts = [PROMPTS[0], [1, 9519, 28, 940, 446, 2, 77, 78], [1, 77, 78, 79, 80, 81, 82, 83, 84]]
    alone = [engine.generate([p], params(8), seeds=[s])[0] for p, s in zip(prompts, [21, 22, 23])]
    before = dict(engine.stats)
    together = engine.generate(prompts, params(8), seeds=[21, 22, 23])  # one packed pass
    assert engine.stats["prefill_passes"] - before["prefill_passes"] == 1
    assert [g.token_ids for g in together] == [g.token_ids for g in alone]
    for g, a in zip(together, alone):
        assert g.logprobs == pytest.approx(a.logprobs, abs=1e-5)


def test_rows_of_unequal_lengths_enter_in_one_packed_pass(tiny_model):
    """A 4-token and a 40-token prompt enter together (their tokens run packed, no padding): one pass,
    both rows draw their first token at once, and each row's logits equal HF's forward of its prompt."""
    fresh = HFEngine(tiny_model, RO, seed=0)
    prompts = [[1, 77, 78, 79], [1] + list(range(600, 639))]
    gens = fresh.generate(prompts, params(6), seeds=[1, 2])
    assert fresh.stats["prefill_passes"] == 1 and fresh.stats["steps"] == 5
    assert fresh.stats["prefill_tokens"] == 44
    alone = [fresh.generate([p], params(6), seeds=[s])[0] for p, s in zip(prompts, (1, 2))]
    assert [g.token_ids for g in gens] == [a.token_ids for a in alone]
    logits = fresh.call(fresh.decoder.prefill, 0, prompts, [0, 0])
    with torch.no_grad():
        for row, p in zip(logits, prompts):
            assert torch.allclose(row, fresh.model(torch.tensor([p])).logits[0, -1], atol=1e-5)


def test_samples_of_one_prompt_prefill_it_once(tiny_model):
    fresh = HFEngine(tiny_model, RO, seed=0)
    prompt = PROMPTS[0] * 3  # 27 tokens: past MIN_REUSE
    gens = fresh.generate([prompt] * 4, params(6), seeds=[1, 2, 3, 4])
    # the first row prefills the prompt; in a second pass the other three copy all but its last token
    assert fresh.stats["prefill_passes"] == 2 and fresh.stats["steps"] == 5  # all four drew token 1 at once
    assert fresh.stats["prefill_tokens"] == len(prompt) + 3 and fresh.stats["reused_tokens"] == 3 * (len(prompt) - 1)
    alone = [fresh.generate([prompt], params(6), seeds=[s])[0] for s in (1, 2, 3, 4)]
    assert [g.token_ids for g in gens] == [a.token_ids for a in alone]


def test_rows_sharing_a_system_prompt_compute_it_once(tiny_model):
    """Prompts that share a prefix shorter than half of each (a system prompt) enter together: one
    pass computes the first prompt, a second pass the others' tails over a copy of the shared K/V."""
    fresh = HFEngine(tiny_model, RO, seed=0)
    system = PROMPTS[0] * 2  # 18 tokens: past MIN_REUSE
    tails = [[7] + PROMPTS[1] * 3, [8] + PROMPTS[2] * 4, [9] + PROMPTS[1] * 3]  # 31 / 29 / 31 tokens
    prompts = [system + t for t in tails]
    gens = fresh.generate(prompts, params(6), seeds=[1, 2, 3])
    assert fresh.stats["prefill_passes"] == 2 and fresh.stats["reused_tokens"] == 2 * len(system)
    assert fresh.stats["prefill_tokens"] == len(prompts[0]) + len(tails[1]) + len(tails[2])
    alone = [fresh.generate([p], params(6), seeds=[s])[0] for p, s in zip(prompts, (1, 2, 3))]
    assert [g.token_ids for g in gens] == [a.token_ids for a in alone]
    for g, a in zip(gens, alone):
        assert g.logprobs == pytest.approx(a.logprobs, abs=1e-4)


def test_async_front_batches_concurrent_requests_and_drops_finished_rows(engine):
    front = engine.scheduler()
    assert front is engine.scheduler() and front.tokenizer is engine.tokenizer
    asks = [(PROMPTS[0], params(3), 11), (PROMPTS[1], params(20), 12), (PROMPTS[2], params(9), 13),
            (PROMPTS[0], params(14), 14)]
    alone = [engine.generate([p], sp, seeds=[s])[0] for p, sp, s in asks]
    before = dict(engine.stats)

    async def together():
        return await asyncio.gather(*(front.generate([p], sp, [s]) for p, sp, s in asks))

    outs = [o[0] for o in asyncio.run(together())]
    assert [o.token_ids for o in outs] == [a.token_ids for a in alone]
    decoded = engine.stats["decode_rows"] - before["decode_rows"]
    # every row-step of a decode pass yields one token of a live row: finished rows cost nothing
    assert decoded == sum(len(o.token_ids) - 1 for o in outs)


def test_stage2_prompt_reuses_the_kv_of_its_stage1_row(tiny_model):
    sp = params(10)
    cached = HFEngine(tiny_model, RO, seed=0)
    plain = HFEngine(tiny_model, _ro(prefix_cache_tokens=0), seed=0)
    p1 = PROMPTS[0] + PROMPTS[1] + PROMPTS[2]  # 20 tokens
    first = cached.generate([p1] * 2, sp, seeds=[1, 2])
    assert cached.stats["reused_tokens"] == len(p1) - 1  # the second row copied the first one's prompt
    assert first[0].token_ids[0] != first[1].token_ids[0]
    p2 = [p1 + g.token_ids + [198, 77, 78] for g in first]  # p1 + ĉ + feedback
    before = cached.stats["prefill_tokens"]
    got = cached.generate(p2, sp, seeds=[3, 4])
    assert cached.stats["prefill_tokens"] - before == 2 * 4  # ĉ's last token + the feedback
    want = [plain.generate([p], sp, seeds=[s])[0] for p, s in zip(p2, [3, 4])]  # full prefills
    assert plain.stats["reused_tokens"] == 0
    assert [g.token_ids for g in got] == [g.token_ids for g in want]
    for g, w in zip(got, want):
        assert g.logprobs == pytest.approx(w.logprobs, abs=1e-4)


# ------------------------------------------------------------------ numerics and limits


def test_slot_forward_matches_hf_forward(engine):
    prompt = PROMPTS[0]
    engine.decoder.reserve(1)
    logits = engine.decoder.prefill(0, [prompt], [0])  # no row is live: slot 0 is free
    with torch.no_grad():
        want = engine.model(torch.tensor([prompt])).logits[0, -1]
    assert torch.allclose(logits[0], want, atol=1e-5)


def test_bfloat16_logprobs_are_close_to_a_float32_teacher(tiny_model, engine):
    """bfloat16 weights and K/V: recorded log-probs within 0.02 nats (mean 0.005) of the float32
    model teacher-forced on the same tokens (measured: 0.004 / 0.001 on this flat random model;
    bench_engine.py reports the gap on SmolLM2); the learner recomputes them when precisions differ."""
    bf16 = HFEngine(tiny_model, RO, dtype="bfloat16", seed=0)
    gens = bf16.generate(PROMPTS, params(24, 0.9, 0.95, 64), seeds=[1, 2, 3])
    assert bf16.model.dtype == torch.bfloat16 and bf16.decoder.keys[0].dtype == torch.bfloat16
    gaps = torch.cat([(torch.tensor(g.logprobs) - _teacher_forced(engine.model, p, g.token_ids, 0.9)).abs()
                      for p, g in zip(PROMPTS, gens)])
    assert gaps.max() < 0.02 and gaps.mean() < 0.005, gaps


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_engine_follows_in_place_weight_loads(tiny_model, dtype):
    """After a load into linear weights, the engine (oneDNN-packed linears on a CPU, float32 too)
    still matches the model's own HF forward on the tokens it drew."""
    eng = HFEngine(tiny_model, RO, dtype=dtype, seed=0)
    assert eng.decoder.packed == cpu_packing(getattr(torch, dtype))
    assert eng.decoder.native_layers == (eng.decoder.packed and eng.decoder.kernel is not None)  # Qwen2: served
    _follows_a_load(eng, params(12), 1e-4 if dtype == "float32" else 0.05)


def _follows_a_load(eng, p, atol):
    """Load into a plain packed linear, one fused with others (q/k/v) and the tied head; the engine's
    log-probs then match the model's own forward on the tokens it draws."""
    layers = eng.model.model.layers
    eng.load_weights({"model.layers.1.mlp.down_proj.weight": layers[1].mlp.down_proj.weight * 8,
                      "model.layers.0.self_attn.k_proj.weight": layers[0].self_attn.k_proj.weight * 8,
                      "lm_head.weight": eng.model.lm_head.weight * 4}, version=eng.version + 1)
    for prompt, g in zip(PROMPTS, eng.generate(PROMPTS, p, seeds=[1, 2, 3])):
        ref = _teacher_forced(eng.model, prompt, g.token_ids, p.temperature)
        assert torch.allclose(torch.tensor(g.logprobs), ref, atol=atol)


def test_max_seq_len_ends_rows_and_rejects_longer_prompts(tiny_model):
    eng = HFEngine(tiny_model, _ro(max_seq_len=16), seed=0)
    (gen,) = eng.generate([PROMPTS[0]], params(50), seeds=[1])
    assert len(PROMPTS[0]) + len(gen.token_ids) == 16 and gen.finish_reason == "length"
    with pytest.raises(ValueError, match="max_seq_len"):
        eng.generate([list(range(1, 17))], params(4))
    with pytest.raises(ValueError, match="at least one token"):
        eng.generate([[]], params(4))


def test_a_failing_prefill_fails_its_requests_and_the_engine_goes_on(tiny_model, monkeypatch):
    """Rows taken off the queue for a prefill pass that raises get the error (before: they were in
    neither the queue nor the batch, and their caller waited forever)."""
    eng = HFEngine(tiny_model, RO, seed=0)

    def broken(*args):
        raise RuntimeError("prefill failed")

    monkeypatch.setattr(eng.decoder, "prefill", broken)
    done = threading.Event()
    request = eng.submit(PROMPTS[:2], params(4), [1, 2], done.set)
    assert done.wait(timeout=30), "the request was lost"
    with pytest.raises(RuntimeError, match="prefill failed"):
        request.result()
    monkeypatch.undo()
    assert [len(g.token_ids) for g in eng.generate(PROMPTS[:2], params(4), seeds=[1, 2])] == [4, 4]


# ------------------------------------------------------------------ compile


@pytest.mark.parametrize("native", [True, False])
def test_compiled_step_samples_what_eager_samples(tiny_model, engine, native, monkeypatch):
    """float32: the compiled step draws exactly the eager engine's tokens, after 1-row and 1-token
    prefill passes (rows copying a prompt's K/V) too, and for a row joining a full batch mid-decode.
    Both compiled forms: native layer calls with the head and sampler compiled (where the kernels
    serve the model), and the whole step as one graph (a model whose norm is not HF's RMSNorm)."""
    if not native:
        monkeypatch.setattr(decoder, "native_norm", lambda module: False)
    comp = HFEngine(tiny_model, _ro(compile=True, max_batch=4, max_seq_len=64), seed=0)
    assert comp.decoder.native_layers == (native and engine.decoder.native_layers)
    p = params(12, 0.9, 0.95, 64)
    want = engine.generate(PROMPTS, p, seeds=[1, 2, 3])
    got = comp.generate(PROMPTS, p, seeds=[1, 2, 3])
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    for g, w in zip(got, want):
        assert g.logprobs == pytest.approx(w.logprobs, abs=1e-4)
    prompt = PROMPTS[0] * 3  # past MIN_REUSE: one 1-row pass, then 3 rows prefill their last token
    before = dict(comp.stats)
    got = comp.generate([prompt] * 4, p, seeds=[4, 5, 6, 7])
    assert comp.stats["prefill_passes"] - before["prefill_passes"] == 2
    assert comp.stats["reused_tokens"] - before["reused_tokens"] == 3 * (len(prompt) - 1)
    assert [g.token_ids for g in got] == [g.token_ids for g in engine.generate([prompt] * 4, p, seeds=[4, 5, 6, 7])]
    done = threading.Event()
    running = comp.submit(PROMPTS, params(40, 0.9, 0.95, 64), [8, 9, 10], done.set)
    start = comp.stats["steps"]
    while comp.stats["steps"] < start + 3:  # 3 rows decoding: the joining row takes the last slot
        time.sleep(0.001)
    joined = comp.generate([PROMPTS[1] + [77, 78]], p, seeds=[11])
    done.wait()
    assert joined[0].token_ids == engine.generate([PROMPTS[1] + [77, 78]], p, seeds=[11])[0].token_ids
    assert [g.token_ids for g in running.result()] == [
        g.token_ids for g in engine.generate(PROMPTS, params(40, 0.9, 0.95, 64), seeds=[8, 9, 10])]
    _follows_a_load(comp, p, 1e-4)  # the compiled graph and the packed copies both see it


# Where bfloat16 is emulated (escrag/bf16cpu.py: an AVX2-only CPU) its linears have no packed copies and
# the compile is the costliest in the suite (~55 s cold, 16 C++ kernels, 2 cores): there it runs in
# `make test-all`; the float32 test above checks weight loads through packed and compiled code everywhere.
def _slow_where_emulated(test):
    return test if fast_bfloat16("cpu") else pytest.mark.slow(test)


@_slow_where_emulated
def test_compiled_bfloat16_step_sees_weight_loads(tiny_model):
    """bfloat16 (oneDNN-packed linears inside the graph where bf16 is native): log-probs match the
    model's own HF forward; after a load (``_follows_a_load``), the compiled graph and the packed copies
    both see the new weights. (Compiled and eager bf16 differ in rounding: inductor fuses elementwise ops.)"""
    comp = HFEngine(tiny_model, _ro(compile=True, max_batch=4, max_seq_len=64), dtype="bfloat16", seed=0)
    p = params(12, 0.9, 0.95, 64)
    for prompt, g in zip(PROMPTS, comp.generate(PROMPTS, p, seeds=[1, 2, 3])):
        ref = _teacher_forced(comp.model, prompt, g.token_ids, 0.9)
        assert torch.allclose(torch.tensor(g.logprobs), ref, atol=0.05)
    _follows_a_load(comp, p, 0.05)


@pytest.fixture(scope="module")
def smollm2_shaped(tmp_path_factory, tiny_model) -> str:
    """A random 2-layer Llama with SmolLM2-135M's layer shapes (hidden 576, MLP 1536, 9 heads over 3 K/V
    heads): the tiny model's 64-wide matmuls run the same kernels at any batch, these do not."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    out = tmp_path_factory.mktemp("smollm2-shaped")
    tok = AutoTokenizer.from_pretrained(tiny_model)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=576, intermediate_size=1536, num_hidden_layers=2,
                      num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return str(out)


BF16_NATIVE = pytest.mark.skipif(not fast_bfloat16("cpu"),
                                 reason="measured where bfloat16 matmuls are native (AVX512-BF16, AMX)")


@pytest.mark.parametrize("dtype,compiled", [("float32", False), pytest.param("bfloat16", False, marks=BF16_NATIVE),
                                            pytest.param("bfloat16", True, marks=BF16_NATIVE)])
def test_batch_invariant_rows_do_not_depend_on_their_batch(smollm2_shaped, dtype, compiled):
    """``rollout.batch_invariant`` (the CPU demo's comparison: its engine's dtype, uncompiled; compiled
    too in bfloat16): each row's tokens and log-probs are bitwise those it gets alone, whichever rows
    share its decode steps, would share its prefill pass or its prompt's prefix, or join it mid-decode;
    nothing is reused. Without the option the bfloat16 rows fail (a batched prefill pass and copied K/V
    move rows by a rounding error); the float32 ones passed without it on an AVX2 CPU, but nothing
    there promises a kernel's blocking never follows the row count."""
    eng = HFEngine(smollm2_shaped, _ro(compile=compiled, batch_invariant=True, max_batch=8, max_seq_len=128),
                   dtype=dtype, seed=0)
    g = torch.Generator().manual_seed(0)
    chat = [torch.randint(100, 40000, (n,), generator=g).tolist() for n in (40, 55, 31, 62)]
    prompts = [chat[0], chat[0] + [5, 6], chat[1], chat[2], chat[0], chat[3], chat[1][:20], chat[3] + [9]]
    seeds = [3, 1, 4, 1, 5, 9, 2, 6]
    p = params(24, 0.9, 0.95, 64)
    together = eng.generate(prompts, p, seeds=seeds)
    assert eng.stats["prefill_passes"] == len(prompts) and eng.stats["reused_tokens"] == 0
    done = threading.Event()
    running = eng.submit(prompts[:4], p, seeds[:4], done.set)  # the others join these mid-decode
    joined = [eng.generate([q], p, seeds=[s])[0] for q, s in zip(prompts[4:], seeds[4:])]
    done.wait()
    alone = [eng.generate([q], p, seeds=[s])[0] for q, s in zip(prompts, seeds)]
    for got in (together, running.result() + joined):
        assert [g.token_ids for g in got] == [a.token_ids for a in alone]
        assert [g.logprobs for g in got] == [a.logprobs for a in alone]


def test_packed_linears_run_a_prefills_rows_on_the_grid(monkeypatch):
    """A prefill packs any number of tokens; past GRID_ROWS its linears run them padded with zeros to
    escrag.shapes.bucket's grid (oneDNN keeps a primitive per row count: a server's memory grew with
    every new prompt length) and give the same rows as F.linear."""
    from rollout.engines import decoder

    if not decoder.cpu_packing(torch.float32):
        pytest.skip("float32 linears are packed for oneDNN on x86-64 only")
    torch.manual_seed(0)
    w, b = torch.randn(48, 32), torch.randn(48)
    decoder.pack_weight(w)
    rows, real = [], torch.ops.mkldnn._linear_pointwise
    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", lambda x, *a: rows.append(x.shape[0]) or real(x, *a))
    for m in (1, 5, 8, 9, 63, 100, 333):
        x = torch.randn(m, 32)
        torch.testing.assert_close(decoder._packed_linear_fn(x, w, b), torch.nn.functional.linear(x, w, b),
                                   rtol=1e-5, atol=1e-5)
    assert rows == [1, 5, 8, 16, 64, 104, 352]
