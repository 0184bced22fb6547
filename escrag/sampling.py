"""The sampled distribution and token log-probs: one definition for every engine and the learner.

Owns: ``sample`` (one decode step for a batch of rows) and ``token_logprobs``.

Distribution of one step for a row with logits z (Table 4: T 0.9, top-p 0.95): divide by the
temperature T; keep the ``top_k`` largest (0: all); among them keep the smallest best-first prefix
whose probability mass reaches ``top_p`` (the best token is always kept); renormalise and draw. T = 0
is greedy.

Noise. Each row brings its own seed; the draw at decode step t is a Gumbel-max race whose uniform for
token v is a counter-based hash of (seed, t, v). So a row's tokens depend only on its seed and its
logits: not on the other rows of the batch, on their order, on which thread ran first, on continuous
batching, or on a resumed run. A group of N samples uses N derived seeds (``escrag.seeds``).

Log-probs. ``token_logprobs`` is log-softmax(z / T) at the token over the whole vocabulary (T = 0
counts as 1), as verl, OpenRLHF and TRL compute them: the engines record it as the behaviour
log-prob and the learner recomputes it for the ratio of eq. 10. It ignores the top-k/top-p cut; the
sampling distribution is slightly sharper than the one the ratio assumes, as in those frameworks.

Speed. The rule is a full sort's, but sorting 49,152 logits takes ~5 ms a row on one core, more than
a small model's decode step: without top-k, ``_candidates`` looks for a row's nucleus among the tokens
within ``GAPS`` nats of its best (a trained model's: a few hundred). Any other row races its whole
vocabulary first: the winner is the nucleus race's too unless top-p cuts it (about 1 - top-p of the
time, as the race draws from the whole softmax); only then is the cut looked for among its worst
tokens (a flat row), or the row sorted (docs/rollout.md). One log-softmax serves the draw and the
drawn tokens' log-probs.

Fixed here: the largest uniform the hash makes rounded to 1.0 in float32 (Gumbel noise +inf), which on
a token top-p had cut gave NaN and won the race: a token outside the nucleus was drawn in about 0.3%
of the steps that raced the whole vocabulary.
"""

from __future__ import annotations

import torch

_M32 = 0xFFFFFFFF
_MIX = 0x45D9F3B  # < 2**27: products of 32-bit values stay below 2**63 in int64
_GOLDEN = 0x9E3779B1


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash on int64 tensors holding values in [0, 2**32), in place (fewer passes
    over a [B, V] tensor: 7 ms for 8 rows of 49,152 against 10 with new tensors)."""
    x ^= x >> 16
    x.mul_(_MIX).bitwise_and_(_M32)
    x ^= x >> 16
    x.mul_(_MIX).bitwise_and_(_M32)
    x ^= x >> 16
    return x


def uniforms(seeds: torch.Tensor, steps: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Uniforms in (0, 1) for each row's candidate tokens: seeds, steps [B] int64; tokens [B, K]."""
    row = _mix32(_mix32(seeds & _M32) ^ (steps & _M32))  # [B]
    h = _mix32((tokens * _GOLDEN).add_(row[:, None]).bitwise_and_(_M32))  # [B, K]
    # (2**24 - 0.5) / 2**24 rounds to 1.0 in float32: kept below 1 (module doc, "Fixed here")
    return (((h >> 8).to(torch.float32) + 0.5) / float(1 << 24)).clamp_(max=1.0 - 2.0 ** -24)


GAPS = (10.0, 5.0)  # top-p without top-k: a row's nucleus looked for among its tokens up to this many nats
# below its best
WIDE = 4096  # ... where at most this many are (a trained model's nucleus)
STRIDE = 32  # how many tokens lie within a gap: first estimated on every STRIDE-th token
TAIL = 8  # then its vocab / TAIL worst (a flat row, a random model's: top-p cuts only among those)


def sample(logits: torch.Tensor, temperature: float, top_p: float, top_k: int, seeds: torch.Tensor,
           steps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One decode step. logits [B, V]; seeds, steps [B] int64 -> (tokens [B], log-probs [B]).

    Log-probs are ``token_logprobs`` of the drawn tokens, bit for bit (module doc): read from the
    log-softmax the draw uses rather than computed again."""
    logits = logits.float()
    if temperature == 0:
        tok = logits.argmax(dim=-1)
        return tok, token_logprobs(logits, tok, temperature)
    scaled = logits / temperature
    logp = scaled.log_softmax(dim=-1)
    tok = torch.empty(logits.shape[0], dtype=torch.long, device=logits.device)
    groups, wide = _candidates(scaled, logp, top_p, top_k)
    if len(wide):  # the race over the whole row: its winner is in the nucleus with probability >= top-p
        whole = logp[wide]
        tok[wide] = won = _race(whole, None, seeds[wide], steps[wide])
        cut = _outside_nucleus(whole, won, top_p)  # then the race among the nucleus has the same winner
        if cut.any():
            groups += _flat_or_sorted(whole[cut], wide[cut], top_p)
    for rows, cand, idx in groups:
        tok[rows] = _race(cand, idx, seeds[rows], steps[rows])
    return tok, logp.gather(-1, tok[:, None]).squeeze(-1)


def _race(cand: torch.Tensor, idx: torch.Tensor | None, seeds: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """The Gumbel-max draw: for each row, the token ``idx`` [R, C] (None: the vocabulary in order) whose
    log-prob ``cand`` plus noise is the largest (the first such)."""
    if idx is None:
        idx = torch.arange(cand.shape[-1], device=cand.device).expand_as(cand)
    gumbel = -torch.log(-torch.log(uniforms(seeds, steps, idx)))
    return idx.gather(-1, (cand + gumbel).argmax(dim=-1, keepdim=True)).squeeze(-1)


def _outside_nucleus(logp: torch.Tensor, tokens: torch.Tensor, top_p: float) -> torch.Tensor:
    """[R] bool: whether top-p cuts each row's token, i.e. the tokens better than it hold ``top_p``."""
    probs = logp.exp()  # then masked: exp of -inf is ~4x slower here than of a number
    return probs.masked_fill_(logp <= logp.gather(-1, tokens[:, None]), 0.0).sum(dim=-1) >= top_p


def _candidates(scaled: torch.Tensor, logp: torch.Tensor, top_p: float, top_k: int) -> tuple[list, torch.Tensor]:
    """([(rows, logp, idx)], wide): for those rows, candidate tokens [R, C] and their log-probs, -inf where
    top-p cuts (or padding); and the rows whose nucleus is not among at most ``WIDE`` tokens within
    ``GAPS`` of their best (``sample`` races their whole vocabulary). A full sort of the vocabulary (42 ms
    for 8 rows of 49,152 on one core, most of a small model's decode step) is needed only for a wide row
    whose winner top-p cuts (``_flat_or_sorted``: ~5% of them, about 1 - top-p). A row's path depends on
    its own logits only, so it draws the same token in any batch. Under torch.compile every row is
    sorted (one graph)."""
    vocab, every = scaled.shape[-1], torch.arange(scaled.shape[0], device=scaled.device)
    if 0 < top_k < vocab:
        vals, idx = scaled.topk(top_k, dim=-1)  # sorted, largest first
        return [(every, _cut_below(vals.log_softmax(dim=-1), top_p)[0], idx)], every[:0]
    if top_p >= 1.0:
        return [(every, logp, torch.arange(vocab, device=scaled.device).expand_as(logp))], every[:0]
    if torch.compiler.is_compiling():
        vals, idx = logp.sort(dim=-1, descending=True)
        return [(every, _cut_below(vals, top_p)[0], idx)], every[:0]
    out, beyond, wide = [], [], every
    best, probe = logp.amax(dim=-1, keepdim=True), logp[:, ::STRIDE]
    for gap in GAPS:  # a row with more than WIDE tokens within a gap (by the probe's count) tries the next
        few, wide = _split(wide, (probe[wide] >= best[wide] - gap).sum(dim=-1) * STRIDE <= WIDE)
        if len(few):
            part = logp if len(few) == len(logp) else logp[few]
            fits, vals, idx = _best_first(part, part >= best[few] - gap, 2 * WIDE)
            rows, far = _split(few, fits)
            beyond.append(far)  # the probe was far off: more than twice WIDE
            if len(rows):
                head, reached = _cut_below(vals, top_p)
                done, short = _split(rows, reached)
                out.append((done, head, idx) if not len(short) else (done, head[reached], idx[reached]))
                beyond.append(short)  # the nucleus reaches past the gap
        if not len(wide):
            break
    return out, torch.cat([*beyond, wide])


def _split(rows: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows where ``mask`` holds, the others); without indexing where it holds for all (the usual case:
    a boolean index costs ~40 µs, most of a one-row step's sampling)."""
    return (rows, rows[:0]) if bool(mask.all()) else (rows[mask], rows[~mask])


def _best_first(logp: torch.Tensor, mask: torch.Tensor, limit: int) -> tuple[torch.Tensor, ...]:
    """Where ``mask`` holds for 1 to ``limit`` tokens of a row (``fits`` [R] bool; none: a NaN row), the
    row's log-probs there, best first, and their columns: [F, C], C the most such a row has; a shorter
    row is padded with -inf at column V (one past the vocabulary)."""
    rows, cols = _nonzero(mask)
    count = torch.bincount(rows, minlength=len(logp))
    fits = (count > 0) & (count <= limit)
    if not fits.all():
        keep = fits[rows]
        rows, cols, count, logp = (fits.cumsum(0) - 1)[rows[keep]], cols[keep], count[fits], logp[fits]
        if not len(logp):
            return fits, None, None
    width = int(count.max())  # flat indices below: 5-10x faster than indexing by (rows, cols) pairs
    at = rows * width + torch.arange(len(rows), device=logp.device) - (count.cumsum(0) - count)[rows]
    vals = logp.new_full((len(logp) * width,), float("-inf"))
    vals.index_copy_(0, at, logp.contiguous().view(-1).index_select(0, rows * logp.shape[-1] + cols))
    idx = torch.full(vals.shape, logp.shape[-1], dtype=torch.long, device=logp.device).index_copy_(0, at, cols)
    vals, order = vals.view(len(logp), width).sort(dim=-1, descending=True)
    return fits, vals, idx.view(len(logp), width).gather(-1, order)


def _nonzero(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``mask.nonzero(as_tuple=True)`` of a [R, V] bool tensor, row-major, 4-5x faster where few hold: the
    words of 8 bytes that hold any are found first (5.2 against 1.2 ms for 32 rows of 49,152)."""
    if mask.shape[-1] % 8 or not mask.is_contiguous():
        return mask.nonzero(as_tuple=True)
    rows, words = mask.view(torch.int64).nonzero(as_tuple=True)
    at, byte = mask.view(len(mask), -1, 8)[rows, words].nonzero(as_tuple=True)
    return rows[at], words[at] * 8 + byte


def _cut_below(logp: torch.Tensor, top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """logp [R, C] best first: -inf where the mass of the better tokens reaches ``top_p`` (the best is
    always kept); and per row whether these C tokens hold that mass (no token after them is kept)."""
    if top_p >= 1.0:
        return logp, torch.ones(logp.shape[0], dtype=torch.bool, device=logp.device)
    probs = logp.exp()
    through = probs.cumsum(dim=-1)
    return logp.masked_fill(through - probs >= top_p, float("-inf")), through[:, -1] >= top_p


def _flat_or_sorted(logp: torch.Tensor, rows: torch.Tensor, top_p: float) -> list[tuple]:
    """Rows whose nucleus was not found near their best and whose whole-row winner top-p cuts: top-p cuts
    only among the vocab / TAIL worst where they hold more than 1 - top_p of the mass (a flat row), else
    the whole row is sorted."""
    low, low_idx = logp.topk(max(1, logp.shape[-1] // TAIL), dim=-1, largest=False)  # worst first
    probs = low.exp()
    above = logp.exp().sum(dim=-1, keepdim=True) - probs.cumsum(dim=-1)  # mass of the better tokens
    flat = above[:, -1] < top_p  # the best of these is kept, so every token better than it is too
    cut = logp[flat].scatter(-1, low_idx[flat], low[flat].masked_fill(above[flat] >= top_p, float("-inf")))
    out = [(rows[flat], cut, torch.arange(logp.shape[-1], device=logp.device).expand_as(cut))]
    if not flat.all():
        vals, idx = logp[~flat].sort(dim=-1, descending=True)
        out.append((rows[~flat], _cut_below(vals, top_p)[0], idx))
    return out


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float) -> torch.Tensor:
    """log-softmax(logits / T) at ``tokens``: logits [..., V], tokens [...] -> [...] float32."""
    t = temperature if temperature > 0 else 1.0
    scaled = logits.to(torch.float32, copy=True)
    if t != 1.0:
        scaled.div_(t)  # in place on the copy: one pass over [..., V] fewer than ``logits.float() / t``
    nll = torch.nn.functional.cross_entropy(scaled.reshape(-1, scaled.shape[-1]), tokens.reshape(-1), reduction="none")
    return -nll.view(tokens.shape)  # cross_entropy: log-softmax and gather fused, and a lighter backward
