"""``escrag.sampling.sample`` against the rule its module states, computed the plain way (a full sort of
the vocabulary in float64, the same counter-based noise): on rows whose nucleus is small (a trained
model's), nearly the whole vocabulary (a random model's), half of it, reaches far below the best
token, or where the probe of how many tokens lie near the best misjudges the row, every seeded draw is
the reference's token and its log-prob is ``token_logprobs``' bit for bit; a row draws the same token in
any batch; top-k and top-p 1 too. A wide row's whole-vocabulary winner is judged in or out of the
nucleus as the reference's nucleus has it. A token top-p cuts is never drawn, also where its noise is
the largest the hash makes.

Run: .venv/bin/python -m pytest -q tests/test_sampling.py"""

import pytest
import torch

from escrag import sampling
from escrag.sampling import WIDE, sample, token_logprobs, uniforms

pytestmark = pytest.mark.unit

VOCAB = 49152  # SmolLM2's


def reference(logits, temperature, top_p, top_k, seeds, steps):
    """Divide by T; keep the top-k (0: all); keep the best-first prefix until its mass reaches top-p
    (the best always); race the kept tokens' log-probs plus Gumbel noise of (seed, step, token)."""
    scaled = logits.double() / temperature
    vals, idx = scaled.sort(dim=-1, descending=True)
    if top_k:
        vals, idx = vals[:, :top_k], idx[:, :top_k]
    logp = vals.log_softmax(dim=-1)
    probs = logp.exp()
    logp = logp.masked_fill(probs.cumsum(dim=-1) - probs >= top_p, float("-inf"))
    gumbel = -torch.log(-torch.log(uniforms(seeds, steps, idx).double()))
    race = (logp + gumbel).masked_fill(logp == float("-inf"), float("-inf"))  # a cut token never runs
    return idx.gather(-1, race.argmax(dim=-1, keepdim=True)).squeeze(-1)


def rows() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)

    def plateau(n: int, low: float) -> torch.Tensor:  # n tokens at 0, the rest at ``low``, a little noise
        x = torch.full((VOCAB,), low)
        x[torch.randperm(VOCAB, generator=g)[:n]] = 0.0
        return x + torch.randn(VOCAB, generator=g) * 0.02

    flat = torch.randn(VOCAB, generator=g) * 0.02
    return {"peaked": torch.randn(VOCAB, generator=g) * 4,  # nucleus of ~120 tokens
            "wide": plateau(1000, -8.0),  # ~950
            "flat": flat,  # ~95% of the vocabulary (a random model: ~93%)
            "half": plateau(20000, -5.0),  # ~19,000
            "far": plateau(1, -10.5),  # the best token and ~40,000 of those 10.5 below it
            # every STRIDE-th token low: the probe finds few tokens near the best, where nearly all are
            "misjudged": flat.index_fill(0, torch.arange(0, VOCAB, sampling.STRIDE), -20.0)}


def test_each_kind_of_row_takes_its_path():
    kinds = rows()
    batch = torch.stack(list(kinds.values())) / 0.9
    groups, wide = sampling._candidates(batch, batch.log_softmax(dim=-1), 0.95, 0)
    near = {row: len(cols) for r, _, idx in groups for row, cols in zip(r.tolist(), idx)}
    # the tokens within 10 nats of the best; within 5 (the plateau); else the whole row races (also
    # where the probe misjudged the row, or the nucleus reaches past 10 nats)
    assert near[0] <= WIDE and near[1] == 1000 and sorted(near) == [0, 1]
    assert sorted(wide.tolist()) == [2, 3, 4, 5]


def test_a_wide_rows_winner_is_checked_against_its_nucleus():
    """A wide row races its whole vocabulary: the winner is in the nucleus with probability >= top-p (the
    race draws from the whole softmax); where top-p cuts it, the row is cut and raced again."""
    n = 400
    for kind in ("flat", "half"):
        logp = (rows()[kind] / 0.9).log_softmax(dim=-1).expand(n, -1)
        won = sampling._race(logp, None, torch.arange(n) * 7919, torch.arange(n) % 5)
        vals, idx = logp[0].double().sort(descending=True)
        nucleus = set(idx[vals.exp().cumsum(0) - vals.exp() < 0.95].tolist())
        cut = sampling._outside_nucleus(logp, won, 0.95)
        assert cut.tolist() == [int(w) not in nucleus for w in won]
        assert 0 < int(cut.sum()) < n // 8  # ~5%: about 1 - top-p


@pytest.mark.parametrize("kind", ["peaked", "wide", "flat", "half", "far", "misjudged"])
def test_draws_equal_the_full_sort_rule(kind):
    n = 400
    logits = rows()[kind].expand(n, -1)
    seeds, steps = torch.arange(n) * 7919, torch.arange(n) % 5
    got, logprobs = sample(logits, 0.9, 0.95, 0, seeds, steps)
    assert torch.equal(got, reference(logits, 0.9, 0.95, 0, seeds, steps))
    assert len(set(got.tolist())) > {"peaked": 1, "far": n // 8}.get(kind, n // 2)  # the noise does vary
    assert torch.equal(logprobs, token_logprobs(logits, got, 0.9))  # what the engines record


@pytest.mark.parametrize("top_p,top_k", [(1.0, 0), (0.9, 10), (1.0, 50)])
def test_top_k_and_no_top_p_equal_the_rule(top_p, top_k):
    logits = torch.stack(list(rows().values())).repeat(100, 1)
    seeds, steps = torch.arange(len(logits)), torch.zeros(len(logits), dtype=torch.long)
    assert torch.equal(sample(logits, 0.7, top_p, top_k, seeds, steps)[0],
                       reference(logits, 0.7, top_p, top_k, seeds, steps))


def test_a_row_draws_the_same_token_in_any_batch():
    kinds = torch.stack(list(rows().values()))
    batch = kinds.repeat(3, 1)[torch.randperm(12, generator=torch.Generator().manual_seed(1))]
    seeds, steps = torch.arange(12) + 100, torch.full((12,), 3)
    together = sample(batch, 0.9, 0.95, 0, seeds, steps)[0]
    alone = torch.cat([sample(batch[i:i + 1], 0.9, 0.95, 0, seeds[i:i + 1], steps[i:i + 1])[0] for i in range(12)])
    assert torch.equal(together, alone)


def test_a_cut_token_is_never_drawn_on_the_largest_uniform():
    """One (seed, step, token) in 2**24 hashes to the top uniform, which used to round to 1.0 in float32:
    Gumbel noise +inf, and on a token top-p had cut (-inf) a NaN that argmax took, so a token outside
    the nucleus was drawn in ~0.3% of the steps that race the whole vocabulary (a flat row's here)."""
    tokens = torch.arange(VOCAB)[None]
    seed = next(s for s in range(20000) if (uniforms(torch.tensor([s]), torch.tensor([0]), tokens) >= 1 - 2 ** -24).any())
    u = uniforms(torch.tensor([seed]), torch.tensor([0]), tokens)
    top = int(u.argmax())
    assert float(u[0, top]) < 1.0
    flat = rows()["flat"].clone()
    flat[top] = -10.0  # the worst token of the row: top-p cuts it
    drawn = sample(flat[None], 0.9, 0.95, 0, torch.tensor([seed]), torch.tensor([0]))[0]
    assert int(drawn) != top and torch.equal(drawn, reference(flat[None], 0.9, 0.95, 0, torch.tensor([seed]),
                                                              torch.tensor([0])))
