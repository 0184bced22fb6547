"""Same objective on both backends: our ``trainer.grpo.policy_loss`` against OpenRLHF 0.11.2's own
``PolicyLoss`` + ``compute_approx_kl`` + ``aggregate_loss`` (the pinned package's files, loaded without
its CUDA-only imports), with the settings the launcher emits for the paper presets: equal loss and
equal gradients on random tensors, token-mean and seq-mean aggregation, and the micro-batch split with
a global token count. Differences by design are named and shown to exist:
1. OpenRLHF clamps the k3 value to [-10, 10] (and its log-ratio below -10), ours does not;
2. its seq-mean-token-mean leaves fully masked sequences out of the mean, ours counts them (our
   learner never ships one: it drops sequences with no trained token);
3. group advantages (not a loss function): OpenRLHF's ``group_norm`` divides by the sample std (N-1)
   plus 1e-9, ours (eq. 9) by sqrt(population variance + eps); that code sits inside a Ray actor
   method and cannot be loaded here, so docs/cluster.md states it.
Run: .venv/bin/python -m pytest -q tests/test_openrlhf_objective.py"""

import ast
import importlib.util
import sys
import types
from pathlib import Path

import pytest
import torch

from escrag.config import load_config
from trainer.grpo import policy_loss
from trainer.openrlhf.launch import build_argv, check_argv

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
pytest.importorskip("openrlhf", reason="make install adds the no-deps OpenRLHF these tests read")
MODELS = Path(importlib.util.find_spec("openrlhf").submodule_search_locations[0]) / "models"


def _top_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = {a.name.split(".")[0] for n in tree.body if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module.split(".")[0] for n in tree.body if isinstance(n, ast.ImportFrom) and n.level == 0}
    return names


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def orl():
    """``openrlhf/models/utils.py`` and ``loss.py`` as modules. Of their top-level imports only
    ``deepspeed`` (a CUDA training library, used by ``set_z3_leaf_modules``, which these tests never
    call) is missing here; an empty stand-in module takes its name while the two files load, and is
    gone afterwards. Importing ``openrlhf.models`` itself would pull flash-attn through its actor."""
    missing = {m for f in ("utils.py", "loss.py") for m in _top_imports(MODELS / f)
               if importlib.util.find_spec(m) is None}
    assert missing == {"deepspeed"}, missing
    # only the stand-in's own entry is taken back: restoring all of sys.modules (mock.patch.dict) would
    # also drop the torch modules the two files import, and a later import of those (torch.compile in
    # another test module on the same process) re-registers them and fails
    sys.modules["deepspeed"] = types.ModuleType("deepspeed")
    try:
        utils = _load("openrlhf.models.utils", MODELS / "utils.py")
        loss = _load("openrlhf.models.loss", MODELS / "loss.py")
    finally:
        del sys.modules["deepspeed"]
    return types.SimpleNamespace(PolicyLoss=loss.PolicyLoss, aggregate_loss=loss.aggregate_loss,
                                 compute_approx_kl=utils.compute_approx_kl)


def _emitted(preset: str, *overrides: str):
    """Our config and the parsed values of the flags the launcher emits for it."""
    cfg = load_config(ROOT / "configs" / f"{preset}.yaml", list(overrides))
    return cfg, check_argv(build_argv(cfg, policy="Qwen/Qwen2.5-7B-Instruct"))


def _tensors(b=6, t=11, seed=0, spread=0.3):
    g = torch.Generator().manual_seed(seed)
    logp = (-torch.rand(b, t, generator=g) * 3).requires_grad_(True)
    old = (logp.detach() + spread * torch.randn(b, t, generator=g)).clamp(max=0)
    ref = (logp.detach() + spread * torch.randn(b, t, generator=g)).clamp(max=0)
    adv = torch.randn(b, generator=g)
    mask = (torch.rand(b, t, generator=g) > 0.3).float()
    mask[:, 0] = 1.0  # every sequence trains at least one token
    return logp, old, ref, adv, mask


def _openrlhf_loss(orl, args, logp, old, ref, adv, mask, **norm):
    """What OpenRLHF's PolicyModelActor.training_step computes from these parsed flags."""
    eps = args["actor.eps_clip"]
    fn = orl.PolicyLoss(clip_eps_low=eps, clip_eps_high=eps, dual_clip=args["actor.dual_clip"],
                        token_level_loss=args["actor.loss_agg_mode"] == "token-mean",
                        policy_loss_type=args["actor.policy_loss_type"])
    token_level = args["actor.loss_agg_mode"] == "token-mean"
    adv_tok = adv[:, None].expand_as(logp)  # group_norm: one return per sequence on every action token
    pg, *_ = fn(logp, old, adv_tok, action_mask=mask, **norm)
    assert args["algo.kl.use_loss"] and args["algo.kl.estimator"] == "k3"
    kl = orl.compute_approx_kl(logp, ref, log_probs_old=old, kl_estimator=args["algo.kl.estimator"],
                               unbiased_gradient=args["algo.kl.unbiased_gradient"])
    kl_loss = orl.aggregate_loss(kl, mask, token_level_loss=token_level, **norm)
    return pg + kl_loss * args["algo.kl.init_coef"]


def _ours(cfg, logp, old, ref, adv, mask, denom=None):
    g = cfg.grpo
    loss, _ = policy_loss(logp, old, ref, adv, mask, g.clip_eps, g.kl_coef, g.ratio_level, g.loss_agg, denom)
    return loss


def _grad(loss, x):
    (grad,) = torch.autograd.grad(loss, x)
    return grad


@pytest.mark.parametrize("preset", ["paper-7b", "paper-3b"])
@pytest.mark.parametrize("agg", ["token_mean", "seq_mean"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_same_loss_and_gradient(orl, preset, agg, seed):
    cfg, args = _emitted(preset, f"grpo.loss_agg={agg}")
    logp, old, ref, adv, mask = _tensors(seed=seed)
    theirs = _openrlhf_loss(orl, args, logp, old, ref, adv, mask)
    ours = _ours(cfg, logp, old, ref, adv, mask)
    assert torch.allclose(ours, theirs, atol=1e-6, rtol=1e-5), (ours, theirs)
    g_ours, g_theirs = _grad(ours, logp), _grad(theirs, logp)
    assert g_theirs.abs().sum() > 0 and (g_theirs[mask == 0] == 0).all()
    assert torch.allclose(g_ours, g_theirs, atol=1e-7, rtol=1e-5)


def test_clipping_engages_and_still_agrees(orl):
    """Old log-probs far from the current ones: many tokens are clipped on both sides."""
    cfg, args = _emitted("paper-7b")
    logp, old, ref, adv, mask = _tensors(seed=5, spread=1.0)
    ratio = (logp.detach() - old).exp()
    assert ((ratio - 1).abs()[mask.bool()] > 0.2).float().mean() > 0.3
    theirs, ours = _openrlhf_loss(orl, args, logp, old, ref, adv, mask), _ours(cfg, logp, old, ref, adv, mask)
    assert torch.allclose(ours, theirs, atol=1e-6)
    assert torch.allclose(_grad(ours, logp), _grad(theirs, logp), atol=1e-7, rtol=1e-5)


def test_micro_batches_with_the_global_token_count(orl):
    """OpenRLHF divides each micro-batch by the optimizer step's token count (``batch_num_tokens``);
    ours takes the same count as ``denom``: the halves sum to the whole on both sides."""
    cfg, args = _emitted("paper-7b")
    logp, old, ref, adv, mask = _tensors(b=8, seed=3)
    whole = _ours(cfg, logp, old, ref, adv, mask)
    n = float(mask.sum())
    halves_ours, halves_theirs = 0.0, 0.0
    for sl in (slice(0, 3), slice(3, 8)):
        halves_ours = halves_ours + _ours(cfg, logp[sl], old[sl], ref[sl], adv[sl], mask[sl], denom=n)
        halves_theirs = halves_theirs + _openrlhf_loss(orl, args, logp[sl], old[sl], ref[sl], adv[sl], mask[sl],
                                                       batch_num_tokens=torch.tensor(n), dp_size=1)
    assert torch.allclose(halves_ours, whole, atol=1e-6) and torch.allclose(halves_theirs, whole, atol=1e-6)
    assert torch.allclose(_grad(halves_ours, logp), _grad(halves_theirs, logp), atol=1e-7, rtol=1e-5)


def test_difference_k3_clamp(orl):
    """Difference 1: where the policy has drifted far below the reference (log π - log π_ref < -10
    nats) OpenRLHF clamps the KL term, ours keeps growing."""
    cfg, args = _emitted("paper-7b")
    logp, old, ref, adv, mask = _tensors(seed=7)
    far_ref = ref.clone()
    far_ref[0, 0] = logp[0, 0].detach() + 12.0
    theirs = _openrlhf_loss(orl, args, logp, old, far_ref, adv, mask)
    ours = _ours(cfg, logp, old, far_ref, adv, mask)
    assert ours > theirs + 1.0  # k3 at a 12-nat gap is ~1.6e5 unclamped, 10 clamped


def test_difference_fully_masked_sequence_in_seq_mean(orl):
    """Difference 2: a sequence with no trained token counts in our seq-mean denominator only."""
    cfg, args = _emitted("paper-7b", "grpo.loss_agg=seq_mean")
    logp, old, ref, adv, mask = _tensors(seed=8)
    mask[2] = 0.0
    theirs = _openrlhf_loss(orl, args, logp, old, ref, adv, mask)
    ours = _ours(cfg, logp, old, ref, adv, mask)
    b = mask.shape[0]
    assert torch.allclose(ours * b / (b - 1), theirs, atol=1e-6)
