"""GRPO math invariants (trainer/grpo.py): zero-mean advantages per group, constant groups give zero
advantage and zero gradient, micro-batch losses sum to the whole-batch loss, ratio 1 reduces to the
policy-gradient estimate, clipping stops the gradient, k3 KL is non-negative and zero at the
reference, and a plain-Python loop reference equals the vectorized code on seeded shapes. The
decoupled objective for off-policy groups: with π_prox == π_behaviour it is exactly the plain loss
(value and gradient), it equals the loop reference (token and sequence ratios, with and without the
weight's truncation), the weight carries no gradient and scales each token's policy gradient, and its
metrics report the untruncated mean and max.
Run: .venv/bin/python -m pytest -q tests/test_grpo.py   (~2 s)"""

import math

import pytest
import torch

from escrag.config import GrpoConfig
from trainer.grpo import group_advantages, k3_kl, policy_loss

pytestmark = pytest.mark.unit

G = GrpoConfig()  # the config's defaults, passed explicitly where a test does not vary them


def _batch(seed=0, B=6, T=9):
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(B, T, generator=g) * 3
    old = logp + 0.3 * torch.randn(B, T, generator=g)
    ref = logp + 0.3 * torch.randn(B, T, generator=g)
    mask = (torch.rand(B, T, generator=g) > 0.3).float()
    mask[:, 0] = 1.0
    adv = torch.randn(B, generator=g)
    return logp, old, ref, adv, mask


# ----------------------------------------------------------------------------- loop references


def loop_advantages(rewards, eps):
    out = []
    for row in rewards:
        mean = sum(row) / len(row)
        var = sum((r - mean) ** 2 for r in row) / len(row)
        out.append([(r - mean) / math.sqrt(var + eps) for r in row])
    return out


def loop_loss(logp, old, ref, adv, mask, clip_eps, kl_coef, ratio_level, loss_agg, behav=None, cap=None):
    """``behav``: the decoupled objective, each token's surrogate weighted by min(π_old / π_behav, cap)."""
    B, T = len(logp), len(logp[0])
    tok_terms, seq_terms, n_tok = [], [], 0
    for b in range(B):
        seq_delta = sum((logp[b][t] - old[b][t]) for t in range(T) if mask[b][t])
        seq_behav = sum((old[b][t] - behav[b][t]) for t in range(T) if mask[b][t]) if behav else 0.0
        terms = []
        for t in range(T):
            if not mask[b][t]:
                continue
            ratio = math.exp(seq_delta if ratio_level == "sequence" else logp[b][t] - old[b][t])
            clipped = min(max(ratio, 1 - clip_eps), 1 + clip_eps)
            pg = -min(ratio * adv[b], clipped * adv[b])
            if behav:
                w = math.exp(seq_behav if ratio_level == "sequence" else old[b][t] - behav[b][t])
                pg *= w if cap is None else min(w, cap)
            d = ref[b][t] - logp[b][t]
            terms.append(pg + kl_coef * (math.exp(d) - d - 1))
        n_tok += len(terms)
        tok_terms += terms
        seq_terms.append(sum(terms) / max(len(terms), 1))
    if loss_agg == "token_mean":
        return sum(tok_terms) / n_tok
    return sum(seq_terms) / B


# ----------------------------------------------------------------------------- advantages


def test_advantages_zero_mean_unit_std_per_group():
    r = torch.randn(5, 4, generator=torch.Generator().manual_seed(1))
    a = group_advantages(r, eps=1e-8)
    assert torch.allclose(a.mean(-1), torch.zeros(5), atol=1e-6)
    assert torch.allclose(a.pow(2).mean(-1), torch.ones(5), atol=1e-4)  # population std 1


def test_constant_group_gives_zero_advantage():
    r = torch.tensor([[2.0, 2.0, 2.0, 2.0], [0.0, 1.0, 0.0, 1.0]])
    a = group_advantages(r, eps=1e-6)
    assert torch.equal(a[0], torch.zeros(4))
    assert a[1].abs().min() > 0.9


def test_advantages_match_loop_reference():
    r = torch.randn(7, 4, generator=torch.Generator().manual_seed(2))
    want = torch.tensor(loop_advantages(r.tolist(), 0.1))
    assert torch.allclose(group_advantages(r, eps=0.1), want, atol=1e-6)


# ----------------------------------------------------------------------------- loss


@pytest.mark.parametrize("ratio_level", ["token", "sequence"])
@pytest.mark.parametrize("loss_agg", ["token_mean", "seq_mean"])
def test_loss_matches_loop_reference(ratio_level, loss_agg):
    for seed in range(3):
        logp, old, ref, adv, mask = _batch(seed)
        if ratio_level == "sequence":  # keep sequence ratios moderate so both sides of the clip occur
            old = logp + 0.05 * (old - logp)
        loss, _ = policy_loss(logp, old, ref, adv, mask, 0.2, 0.05, ratio_level, loss_agg)
        want = loop_loss(logp.tolist(), old.tolist(), ref.tolist(), adv.tolist(), mask.tolist(),
                         0.2, 0.05, ratio_level, loss_agg)
        assert loss.item() == pytest.approx(want, rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("loss_agg", ["token_mean", "seq_mean"])
def test_micro_batches_sum_to_whole_batch(loss_agg):
    logp, old, ref, adv, mask = _batch(3, B=8)
    whole, _ = policy_loss(logp, old, ref, adv, mask, G.clip_eps, G.kl_coef, G.ratio_level, loss_agg)
    denom = mask.sum().item() if loss_agg == "token_mean" else 8
    parts = [policy_loss(logp[i:i + 3], old[i:i + 3], ref[i:i + 3], adv[i:i + 3], mask[i:i + 3],
                         G.clip_eps, G.kl_coef, G.ratio_level, loss_agg, denom=denom)[0] for i in (0, 3, 6)]
    assert sum(parts).item() == pytest.approx(whole.item(), rel=1e-6)


def test_ratio_one_is_policy_gradient():
    """At θ = θ_old, ∇loss = -Σ A ∇logp / n_tokens (no clipping, no KL)."""
    logp, _, _, adv, mask = _batch(4)
    theta = logp.clone().requires_grad_(True)
    loss, m = policy_loss(theta, logp.clone(), None, adv, mask, G.clip_eps, 0.0, G.ratio_level, G.loss_agg)
    loss.backward()
    want = -(adv[:, None] * mask) / mask.sum()
    assert torch.allclose(theta.grad, want, atol=1e-7)
    assert m["clip_frac"].item() == 0.0 and m["ratio_mean"].item() == pytest.approx(1.0)


def test_constant_group_gives_zero_gradient():
    logp, old, _, _, mask = _batch(5, B=4)
    adv = group_advantages(torch.full((1, 4), 3.0), G.adv_eps)[0]
    theta = logp.clone().requires_grad_(True)
    policy_loss(theta, old, None, adv, mask, G.clip_eps, 0.0, G.ratio_level, G.loss_agg)[0].backward()
    assert torch.count_nonzero(theta.grad) == 0


def test_clipped_tokens_have_no_gradient():
    # ratio e^{0.5} > 1.2 with A > 0, and e^{-0.5} < 0.8 with A < 0: both clipped, gradient 0
    old = torch.zeros(2, 3)
    theta = torch.tensor([[0.5] * 3, [-0.5] * 3], requires_grad=True)
    loss, m = policy_loss(theta, old, None, torch.tensor([1.0, -1.0]), torch.ones(2, 3), G.clip_eps, 0.0,
                          G.ratio_level, G.loss_agg)
    loss.backward()
    assert torch.count_nonzero(theta.grad) == 0 and m["clip_frac"].item() == 1.0
    # the other side of the clip is not clipped: the ratio still moves the loss
    theta2 = torch.tensor([[-0.5] * 3], requires_grad=True)
    loss2, m2 = policy_loss(theta2, torch.zeros(1, 3), None, torch.tensor([1.0]), torch.ones(1, 3),
                            G.clip_eps, 0.0, G.ratio_level, G.loss_agg)
    loss2.backward()
    assert torch.count_nonzero(theta2.grad) == 3 and m2["clip_frac"].item() == 0.0


def test_masked_tokens_get_no_gradient():
    logp, old, ref, adv, mask = _batch(6)
    theta = logp.clone().requires_grad_(True)
    policy_loss(theta, old, ref, adv, mask, G.clip_eps, G.kl_coef, G.ratio_level, G.loss_agg)[0].backward()
    assert torch.count_nonzero(theta.grad * (1 - mask)) == 0


def test_k3_kl_nonnegative_and_zero_at_reference():
    logp, _, ref, _, _ = _batch(7)
    assert (k3_kl(logp, ref) >= 0).all()
    assert torch.count_nonzero(k3_kl(logp, logp)) == 0
    theta = logp.clone().requires_grad_(True)
    loss, m = policy_loss(theta, logp, logp, torch.zeros(6), torch.ones_like(logp), G.clip_eps, 0.05,
                          G.ratio_level, G.loss_agg)
    loss.backward()
    assert m["kl"].item() == 0.0 and torch.count_nonzero(theta.grad) == 0


def test_kl_pulls_towards_reference():
    """One gradient step on the KL term alone reduces the KL."""
    _, _, ref, _, mask = _batch(8)
    theta = (ref + 0.5).clone().requires_grad_(True)
    loss, m0 = policy_loss(theta, theta.detach(), ref, torch.zeros(6), mask, G.clip_eps, 1.0, G.ratio_level,
                           G.loss_agg)
    loss.backward()
    _, m1 = policy_loss(theta.detach() - 5.0 * theta.grad, theta.detach(), ref, torch.zeros(6), mask,
                        G.clip_eps, 1.0, G.ratio_level, G.loss_agg)
    assert m1["kl"] < m0["kl"]


def test_bad_options_are_named():
    logp, old, ref, adv, mask = _batch(9)
    with pytest.raises(ValueError, match="ratio_level"):
        policy_loss(logp, old, ref, adv, mask, G.clip_eps, G.kl_coef, "seq", G.loss_agg)
    with pytest.raises(ValueError, match="loss_agg"):
        policy_loss(logp, old, ref, adv, mask, G.clip_eps, G.kl_coef, G.ratio_level, "sum")


# ----------------------------------------------------------------------------- decoupled objective


def test_decoupled_with_prox_equal_to_behaviour_is_the_plain_loss():
    logp, old, ref, adv, mask = _batch(10)
    theta1, theta2 = logp.clone().requires_grad_(True), logp.clone().requires_grad_(True)
    plain, m1 = policy_loss(theta1, old, ref, adv, mask, G.clip_eps, G.kl_coef, G.ratio_level, G.loss_agg)
    dec, m2 = policy_loss(theta2, old, ref, adv, mask, G.clip_eps, G.kl_coef, G.ratio_level, G.loss_agg,
                          behaviour_logp=old.clone(), weight_cap=2.0)
    plain.backward()
    dec.backward()
    assert dec.item() == plain.item() and torch.equal(theta1.grad, theta2.grad)
    assert m2["iw_mean"].item() == 1.0 and m2["iw_max"].item() == 1.0 and m2["iw_truncated_frac"].item() == 0.0
    assert "iw_mean" not in m1


@pytest.mark.parametrize("ratio_level", ["token", "sequence"])
@pytest.mark.parametrize("cap", [None, 1.5])
def test_decoupled_matches_loop_reference(ratio_level, cap):
    for seed in range(3):
        logp, old, ref, adv, mask = _batch(20 + seed)
        behav = old + 0.4 * torch.randn(old.shape, generator=torch.Generator().manual_seed(seed))
        if ratio_level == "sequence":  # moderate sequence ratios and weights
            old, behav = logp + 0.05 * (old - logp), logp + 0.05 * (behav - logp)
        loss, m = policy_loss(logp, old, ref, adv, mask, 0.2, 0.05, ratio_level, "token_mean",
                              behaviour_logp=behav, weight_cap=cap)
        want = loop_loss(logp.tolist(), old.tolist(), ref.tolist(), adv.tolist(), mask.tolist(), 0.2, 0.05,
                         ratio_level, "token_mean", behav.tolist(), cap)
        assert loss.item() == pytest.approx(want, rel=1e-5, abs=1e-6)
        w = torch.exp(old - behav) if ratio_level == "token" else \
            torch.exp(((old - behav) * mask).sum(-1, keepdim=True)).expand_as(old)
        assert m["iw_max"].item() == pytest.approx(w[mask > 0].max().item(), rel=1e-6)  # untruncated
        assert m["iw_mean"].item() == pytest.approx(w[mask > 0].mean().item(), rel=1e-5)
        if cap is not None:
            assert m["iw_truncated_frac"].item() == pytest.approx((w[mask > 0] > cap).float().mean().item())


def test_decoupled_weight_scales_the_gradient_and_has_none_itself():
    """At θ = π_prox (ratio 1, nothing clipped) the gradient is -w·A·∇logp / n per token, w truncated at
    the cap; π_prox and π_behaviour get no gradient."""
    logp, _, _, adv, mask = _batch(11)
    behav = logp + torch.linspace(-1.0, 1.0, logp.numel()).reshape(logp.shape)
    theta = logp.clone().requires_grad_(True)
    prox, beh = logp.clone().requires_grad_(True), behav.clone().requires_grad_(True)
    loss, _ = policy_loss(theta, prox, None, adv, mask, G.clip_eps, 0.0, G.ratio_level, G.loss_agg,
                          behaviour_logp=beh, weight_cap=2.0)
    loss.backward()
    w = torch.exp(logp - behav).clamp(max=2.0)
    assert torch.allclose(theta.grad, -(w * adv[:, None] * mask) / mask.sum(), atol=1e-7)
    assert beh.grad is None or torch.count_nonzero(beh.grad) == 0
    # prox gets gradient only through the ratio (as π_old always does): that part is the plain loss's
    plain_prox = logp.clone().requires_grad_(True)
    policy_loss(theta.detach(), plain_prox, None, adv, mask, G.clip_eps, 0.0, G.ratio_level, G.loss_agg)[0].backward()
    assert torch.allclose(prox.grad, w * plain_prox.grad, atol=1e-7)
