"""The GRPO learner (trainer/learner.py) on the tiny random Qwen2, with real rollouts from the
transformers engine (rollout/engines/hf_engine.py): the learner's log-probs match the engine's behaviour
log-probs at the sampling temperature (0.7), micro-batching does not change the gradient, gradient
reaches exactly the loss-mask-1 tokens of a micro-batch that mixes prompt and completion lengths (and
a masked span in the middle), π_old is recomputed by default when the engine runs in another
precision, constant-reward groups are skipped and counted, LoRA's reference is the
adapter switched off, exported weights pushed into an engine reproduce the learner's policy, a
state dict round-trips, and gradient checkpointing gives the same step (and really recomputes).
Run: .venv/bin/python -m pytest -q tests/test_learner.py   (~25 s)"""

import pytest
import torch

from escrag.config import load_config
from escrag.records import Sample, ScoredGroup, TokenSequence
from escrag.sampling import token_logprobs
from rollout.engines.base import SamplingParams
from rollout.episode import record
from trainer.learner import Learner, recompute_old
from trainer.policy import compute

pytestmark = pytest.mark.unit

PROMPTS = [[1, 504, 2088, 314, 253, 1345], [1, 9519, 28, 940, 446, 2], [1, 77, 78, 79]]


def _cfg(tiny_model, *over):
    return load_config("configs/cpu-test.yaml", [f"policy.model={tiny_model}", *over])


@pytest.fixture(scope="module")
def engine(tiny_model):
    from rollout.engines.hf_engine import HFEngine

    return HFEngine(tiny_model, _cfg(tiny_model).rollout, seed=0)


def _groups(engine, rewards, n=4, max_new=8, temperature=1.0):
    """One group per reward row, prompts cycling through PROMPTS; completions sampled for real."""
    groups = []
    for gi, row in enumerate(rewards):
        prompt = PROMPTS[gi % len(PROMPTS)]
        gens = engine.generate([prompt] * n, SamplingParams(max_new, temperature, 1.0, 0, ()),
                               seeds=[100 * gi + j for j in range(n)])
        samples = [Sample(record(prompt, g, None, None, True), output=g.text, reward=r) for g, r in zip(gens, row)]
        groups.append(ScoredGroup(f"s/{gi}", samples, engine.version))
    return groups


def _grads(learner):
    return {n: p.grad.clone() for n, p in learner.model.named_parameters() if p.grad is not None}


def test_logprobs_match_engine_at_the_sampling_temperature(tiny_model, engine):
    learner = Learner(_cfg(tiny_model, "rollout.temperature=0.7"))
    groups = _groups(engine, [[1.0, 0.0, 0.5, 0.0]] * 3, temperature=0.7)
    m = learner.step(groups)
    assert m["logp_diff"] < 1e-4, m  # same weights, same temperature: the learner sees the engine's π_old
    assert m["ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    assert m["optimizer_steps"] == 1 and learner.version == 1
    assert m["trained_tokens"] == sum(sum(x.sequence.loss_mask) for g in groups for x in g.samples)
    at_one = Learner(_cfg(tiny_model, "rollout.temperature=1.0"))  # a learner at the wrong temperature
    assert at_one.step(groups)["logp_diff"] > 1e-2


def test_recomputed_old_logprobs_replace_the_behaviour_ones(tiny_model, engine):
    groups = _groups(engine, [[1.0, 0.0, 0.5, 0.0]] * 2)
    for s in groups[0].samples:  # a rollout whose recorded log-probs are off (another engine's kernels)
        s.sequence.old_logprobs = [x - 0.5 if m else x for x, m in zip(s.sequence.old_logprobs, s.sequence.loss_mask)]
    plain = Learner(_cfg(tiny_model)).step(groups)
    again = Learner(_cfg(tiny_model, "grpo.recompute_old_logprobs=true")).step(groups)
    assert plain["ratio_mean"] > 1.1  # the gap shows up as ratio noise without recomputation
    assert again["ratio_mean"] == pytest.approx(1.0, abs=1e-5)  # π_old = π_θ before the first pass
    assert again["logp_diff"] == pytest.approx(0.25, abs=0.02)  # half the tokens are 0.5 off
    # with one pass π_old is that pass's own log-probs; with two, a separate forward: the same first pass
    twice = Learner(_cfg(tiny_model, "grpo.recompute_old_logprobs=true", "grpo.updates_per_batch=2")).step(groups)
    assert twice["ratio_mean"] == pytest.approx(1.0, abs=1e-5) and twice["optimizer_steps"] == 2
    assert twice["logp_diff"] == pytest.approx(again["logp_diff"], abs=1e-6)
    assert twice["grad_norm"] == pytest.approx(again["grad_norm"], rel=1e-5)


def test_auto_recompute_follows_the_engine_precision(tiny_model):
    from escrag.models import fast_bfloat16

    on = lambda *over: recompute_old(_cfg(tiny_model, *over))  # noqa: E731
    assert not on() and on("rollout.dtype=bfloat16") and on("rollout.engine=vllm")
    assert not on("rollout.dtype=bfloat16", "policy.dtype=bfloat16")
    assert not on("rollout.dtype=bfloat16", "grpo.recompute_old_logprobs=false")
    # auto: bfloat16 on hardware with fast bfloat16 (this CPU has AVX512-BF16), else policy.dtype
    assert on("rollout.dtype=auto", "rollout.device=cpu") == fast_bfloat16("cpu")
    assert not on("rollout.dtype=auto", "policy.dtype=bfloat16")


def _masked_loss_by_hand(model, seqs, advs, temperature):
    """Eq. 11's first-pass loss (ratio 1 in value, token mean), computed per sequence without padding
    from every position, then keeping only the mask-1 tokens."""
    n = sum(sum(s.loss_mask) for s in seqs)
    total = 0.0
    for seq, a in zip(seqs, advs):
        ids = torch.tensor([seq.input_ids])
        logp = token_logprobs(model(input_ids=ids).logits[0, :-1], ids[0, 1:], temperature)
        mask = torch.tensor(seq.loss_mask[1:], dtype=torch.float32)
        old = torch.tensor(seq.old_logprobs[1:])
        total = total - (a * torch.exp(logp - old) * mask).sum()
    return total / n


def test_gradient_reaches_only_mask_one_tokens(tiny_model):
    """A micro-batch mixing prompt and completion lengths, one sequence with a masked span between two
    trained spans: the learner's gradient equals the per-sequence hand computation over mask-1 tokens.
    A learner that trained the prompt tail of the short-completion rows, or the middle span, fails."""
    learner = Learner(_cfg(tiny_model, "grpo.kl_coef=0", "grpo.max_grad_norm=1e9", "grpo.micro_batch_size=8"))
    # trained [start, end) spans: prompt 9 + 3 tokens; prompt 3 + 12 tokens; prompt 6, 2 trained, 4
    # masked (a feedback turn), 4 trained. The longest tail reaches into the other rows' prompts.
    shapes = [[(9, 12)], [(3, 15)], [(6, 8), (12, 16)]]
    seqs = []
    for i, spans in enumerate(shapes):
        length = max(e for _, e in spans)
        ids = [(7 * i + 3 * t) % 500 + 1 for t in range(length)]
        mask = [int(any(a <= t < b for a, b in spans)) for t in range(length)]
        with torch.no_grad():  # π_old = π_θ, as on a first pass: ratio 1, nothing clipped
            logp = token_logprobs(learner.model(input_ids=torch.tensor([ids])).logits[0, :-1],
                                  torch.tensor(ids[1:]), learner.temperature)
        old = [0.0] + [x if m else 0.0 for x, m in zip(logp.tolist(), mask[1:])]
        seqs.append(TokenSequence(ids, mask, old, spans))
    advs = [1.0, -0.5, 0.8]
    groups = [ScoredGroup("g", [Sample(s, output="", reward=a) for s, a in zip(seqs, advs)], 0)]
    learner._flatten = lambda _groups: ([[(s, a) for s, a in zip(seqs, advs)]], 0)  # these advantages as given
    learner.step(groups)
    got = _grads(learner)
    ref = Learner(_cfg(tiny_model, "grpo.kl_coef=0"))
    ref.model.zero_grad()
    _masked_loss_by_hand(ref.model, seqs, advs, ref.temperature).backward()
    want = {n: p.grad for n, p in ref.model.named_parameters() if p.grad is not None}
    assert got.keys() == want.keys()
    for name in want:
        assert torch.allclose(got[name], want[name], atol=1e-6, rtol=1e-4), name


def test_micro_batches_give_the_same_gradient(tiny_model, engine):
    groups = _groups(engine, [[1.0, 0.0, 0.5, 0.0], [0.0, 2.0, 0.0, 1.0]])
    whole = Learner(_cfg(tiny_model, "grpo.micro_batch_size=8", "grpo.max_grad_norm=1e9"))
    parts = Learner(_cfg(tiny_model, "grpo.micro_batch_size=3", "grpo.max_grad_norm=1e9"))
    m1, m2 = whole.step(groups), parts.step(groups)
    g1, g2 = _grads(whole), _grads(parts)
    assert g1.keys() == g2.keys() and g1
    for name in g1:
        assert torch.allclose(g1[name], g2[name], atol=1e-6, rtol=1e-4), name
    assert m1["loss"] == pytest.approx(m2["loss"], abs=1e-6)


def _two_stage_group(prompt_len=7):
    """One group of 4 ``p1 + ĉ + feedback + c`` sequences by hand: a common prompt, then ĉ of 2-5
    tokens (trained), a 3-token feedback turn that differs per sample (masked) and c of 1-6 tokens."""
    prompt = [(11 * t) % 400 + 1 for t in range(prompt_len)]
    seqs = []
    for j, (n1, n2) in enumerate([(2, 6), (5, 1), (3, 4), (4, 3)]):
        ids = prompt + [(13 * j + 5 * t) % 400 + 2 for t in range(n1 + 3 + n2)]
        mask = [0] * prompt_len + [1] * n1 + [0] * 3 + [1] * n2
        seqs.append(TokenSequence(ids, mask, [-1.5 * m for m in mask], [(prompt_len, prompt_len + n1)]))
    return seqs


@pytest.mark.parametrize("lora", [False, True])
def test_shared_prompt_gives_the_same_step(tiny_model, engine, lora):
    """``grpo.share_prompt`` (the group's prompt once, its KV cache reused): the same loss, KL and
    gradients as every sequence in full, with the KL term on, for sampled groups (EOS makes their
    lengths differ) and a hand-made two-stage group whose masked feedback turns differ per sample."""
    sampled = _groups(engine, [[1.0, 0.0, 0.5, 0.0], [0.0, 2.0, 0.0, 1.0]])
    made = ScoredGroup("two-stage", [Sample(s, output="", reward=r) for s, r in
                                     zip(_two_stage_group(), [0.3, 1.0, 0.0, 0.6])], 0)
    over = ["grpo.max_grad_norm=1e9", "grpo.kl_coef=0.1", "policy.lora.enabled=" + str(lora).lower()]
    runs = {}
    for share in (False, True):
        learner = Learner(_cfg(tiny_model, *over, f"grpo.share_prompt={str(share).lower()}"))
        if lora:  # a trained adapter, so the reference (adapter off) differs from the policy
            gen = torch.Generator().manual_seed(0)
            with torch.no_grad():
                for n, p in learner.model.named_parameters():
                    if "lora_B" in n:
                        p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
        runs[share] = (learner.step([*sampled, made]), _grads(learner))
    (m0, g0), (m1, g1) = runs[False], runs[True]
    assert m0["kl"] > 1e-6 or not lora
    assert g0.keys() == g1.keys() and g0
    for name in g0:
        assert torch.allclose(g0[name], g1[name], atol=1e-6, rtol=1e-4), name
    assert (m1["loss"], m1["kl"]) == (pytest.approx(m0["loss"], abs=1e-6), pytest.approx(m0["kl"], abs=1e-7))
    assert m1["logp_diff"] == pytest.approx(m0["logp_diff"], abs=1e-5)


def test_shared_prefix_stops_before_the_first_trained_token():
    from trainer.policy import shared_prefix

    seqs = [s.input_ids for s in _two_stage_group(prompt_len=7)]
    assert shared_prefix(seqs, [7] * 4) == 6  # position 6 predicts the first trained token: in the suffix
    assert shared_prefix(seqs, [3, 7, 7, 7]) == 2
    assert shared_prefix(seqs[:1], [7]) == 0
    assert shared_prefix([[1, 2, 3], [1, 9, 3]], [2, 2]) == 1


@pytest.mark.parametrize("lora", [False, True])
def test_gradient_checkpointing_gives_the_same_step(tiny_model, engine, lora):
    """``policy.gradient_checkpointing``: the same loss, KL and gradients (float32, full fine-tune and
    LoRA), and the layers really are recomputed in the backward pass although the learner is in eval
    mode (each MLP runs once more per micro-batch; transformers skips checkpointing in eval mode)."""
    groups = _groups(engine, [[1.0, 0.0, 0.5, 0.0], [0.0, 2.0, 0.0, 1.0]])
    over = ["grpo.micro_batch_size=3", "grpo.max_grad_norm=1e9", "grpo.share_prompt=false",  # calls counted in full
            *(["policy.lora.enabled=true"] * lora)]
    runs = {}
    for on in (False, True):
        learner = Learner(_cfg(tiny_model, *over, f"policy.gradient_checkpointing={str(on).lower()}"))
        calls = []
        hooks = [layer.mlp.register_forward_pre_hook(lambda *_, c=calls: c.append(1)) for layer in learner.model.modules()
                 if type(layer).__name__.endswith("DecoderLayer")]
        m = learner.step(groups)
        for h in hooks:
            h.remove()
        runs[on] = (m, _grads(learner), len(calls))
    (m0, g0, n0), (m1, g1, n1) = runs[False], runs[True]
    micro, layers = -(-m0["trained_sequences"] // 3), 2
    assert n0 >= layers * micro and n1 == n0 + layers * micro  # + one recompute per layer and micro-batch
    assert g0.keys() == g1.keys() and g0
    for name in g0:
        assert torch.allclose(g0[name], g1[name], atol=1e-6, rtol=1e-5), name
    assert (m1["loss"], m1["kl"]) == (pytest.approx(m0["loss"], abs=1e-6), pytest.approx(m0["kl"], abs=1e-7))


def test_constant_reward_groups_are_skipped_and_counted(tiny_model, engine):
    learner = Learner(_cfg(tiny_model))
    before = {n: p.clone() for n, p in learner.model.named_parameters()}
    m = learner.step(_groups(engine, [[1.0] * 4, [0.0] * 4]))
    assert m["zero_adv_groups"] == 2 and m["optimizer_steps"] == 0 and learner.version == 0
    assert all(torch.equal(before[n], p) for n, p in learner.model.named_parameters())
    m = learner.step(_groups(engine, [[1.0] * 4, [0.0, 1.0, 0.0, 0.0]]))
    assert m["zero_adv_groups"] == 1 and m["trained_sequences"] == 4 and learner.version == 1


def test_lora_reference_is_the_adapter_switched_off(tiny_model, engine):
    learner = Learner(_cfg(tiny_model, "policy.lora.enabled=true", "policy.lora.r=4", "grpo.lr=0.05"))
    assert learner.ref is None  # no second copy under LoRA
    groups = _groups(engine, [[1.0, 0.0, 0.5, 0.0]] * 2)
    assert learner.step(groups)["kl"] == pytest.approx(0.0, abs=1e-7)  # B = 0 at init: policy == reference
    m = learner.step(groups)  # after one step the adapter moved the policy away from the reference
    assert m["kl"] > 0


def test_exported_lora_weights_reproduce_the_policy_in_an_engine(tiny_model):
    from rollout.engines.hf_engine import HFEngine

    learner = Learner(_cfg(tiny_model, "policy.lora.enabled=true", "policy.lora.r=4"))
    with torch.no_grad():
        for n, p in learner.model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.2)
    weights = learner.export_weights()
    assert weights and all(k.startswith("model.layers.") and k.endswith("_proj.weight") for k in weights)
    fresh = HFEngine(tiny_model, _cfg(tiny_model).rollout, seed=0)
    fresh.load_weights(weights, version=1)
    ids = torch.tensor([PROMPTS[0]])
    with torch.no_grad():
        want = learner.model(input_ids=ids).logits
        got = fresh.model(input_ids=ids).logits
    assert torch.allclose(want, got, atol=1e-4)
    with pytest.raises(ValueError, match="not newer"):
        fresh.load_weights(weights, version=1)  # workers refuse stale versions


def test_state_dict_round_trip(tiny_model, engine):
    cfg = _cfg(tiny_model, "policy.lora.enabled=true", "policy.lora.r=4")
    a = Learner(cfg)
    a.step(_groups(engine, [[1.0, 0.0, 0.5, 0.0]]))
    b = Learner(cfg)
    b.load_state_dict(a.state_dict())
    assert b.version == a.version == 1
    for (n, p), (_, q) in zip(a.model.named_parameters(), b.model.named_parameters()):
        assert torch.equal(p, q), n
    assert b.optimizer.state_dict()["state"].keys() == a.optimizer.state_dict()["state"].keys()


def test_lora_bf16_step_matches_the_float32_stored_forward(tiny_model):
    """Under LoRA with bfloat16 compute the frozen base Linears are stored in bfloat16 (the operands
    autocast made from float32 weights before) and the LM head runs on the trained positions only:
    the step's gradient equals the hand computation with float32-stored weights under the same
    autocast over every position of every sequence, unpadded (the path before issue 27)."""
    over = ["grpo.kl_coef=0", "grpo.max_grad_norm=1e9", "policy.lora.enabled=true", "policy.dtype=bfloat16"]
    learner = Learner(_cfg(tiny_model, *over))
    base = [m for m in learner.model.modules() if isinstance(m, torch.nn.Linear) and not m.weight.requires_grad]
    head = learner.model.get_base_model().get_output_embeddings()
    assert {m.weight.dtype for m in base if m is not head} == {torch.bfloat16}
    assert {p.dtype for p in learner.params} == {torch.float32}  # the adapters: float32 master weights
    ref = Learner(_cfg(tiny_model, *over))
    for m in base:
        m.to(torch.float32)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # the same trained adapter in both, so the head sees a non-trivial policy
        for (n, p), q in zip(learner.model.named_parameters(), ref.model.parameters()):
            if "lora_B" in n:
                q.copy_(p.copy_(torch.randn(p.shape, generator=gen) * 0.05))
    seqs = _two_stage_group()
    with torch.no_grad(), compute(learner.cfg.policy, ref.model):
        for s in seqs:  # π_old = π_θ: ratio 1
            ids = torch.tensor([s.input_ids])
            lp = token_logprobs(ref.model(input_ids=ids).logits[0, :-1], ids[0, 1:], ref.temperature).tolist()
            s.old_logprobs = [0.0] + [x if m else 0.0 for x, m in zip(lp, s.loss_mask[1:])]
    advs = [1.0, -0.5, 0.8, -1.3]
    learner._flatten = lambda _groups: ([list(zip(seqs, advs))], 0)
    m = learner.step([ScoredGroup("g", [Sample(s, output="", reward=a) for s, a in zip(seqs, advs)], 0)])
    ref.model.zero_grad()
    with compute(ref.cfg.policy, ref.model):
        _masked_loss_by_hand(ref.model, seqs, advs, ref.temperature).backward()
    got = _grads(learner)
    want = {n: p.grad for n, p in ref.model.named_parameters() if p.grad is not None}
    assert got.keys() == want.keys() and got and m["logp_diff"] < 2e-2
    for name in want:  # bfloat16 GEMMs of other shapes round differently: compared as whole tensors
        err = float((got[name] - want[name]).norm() / want[name].norm())
        assert err < 5e-2, (name, err)
