"""The conversation head's reader: ``Backbone`` (a language model's hidden states over a rendered
conversation) and ``render`` (the text it reads)."""

from __future__ import annotations

import numpy as np

from escrag.shapes import bucket

QUESTION = ("\n\nQuestion: Is anyone in this conversation in immediate danger of suicide, self-harm, "
            "violence, abuse or a medical emergency? Answer:")
MAX_CHARS = 2000  # the conversation's last characters that are read (the question is always whole)
PAD_SHARE = 0.1  # on a CPU, the most padding a batch may add to its real length (characters)
MIN_SHARED = 32  # on a CPU, reads whose first tokens agree this far run on the longest one's cached K/V


def render(history: list[dict]) -> str:
    """The conversation as the backbone reads it: its last ``MAX_CHARS`` characters, then the question."""
    text = "\n".join(("Client: " if m.get("role") == "user" else "Counselor: ") + (m.get("content") or "")
                     for m in history)
    return text[-MAX_CHARS:] + QUESTION


def conv_dtype(sc) -> str:
    """``safety.conv_dtype`` resolved for ``safety.conv_device``: ``auto`` is bfloat16 where it is fast
    (``escrag.models.fast_bfloat16``: a GPU, or a CPU with AMX / AVX512-BF16), else float32 (an AVX2
    CPU has no bfloat16 GEMM: ``escrag.bf16cpu`` emulates it at float32's speed at best)."""
    from escrag.models import fast_bfloat16, resolve_device

    if sc.conv_dtype != "auto":
        return sc.conv_dtype
    return "bfloat16" if fast_bfloat16(resolve_device(sc.conv_device)) else "float32"


class Backbone:
    """``features(histories) -> [n, len(layers) * hidden]``: the model's hidden states after each of
    ``layers`` averaged over the tokens of ``render(history)``; float32 weights, under bfloat16
    autocast when ``dtype`` is bfloat16, on the CPU or a GPU (``safety.conv_device``; a backbone
    larger than the default is a GPU's job).

    Batches: renders sorted by length, ``safety.conv_batch`` at a time, padded on the right (a row's
    states do not depend on its batch, causal attention, but in the last bits). On a CPU a batch also
    ends where its padding would pass ``PAD_SHARE``: padding costs as much as real tokens there, and
    renders run 30-520 tokens. Measured (SmolLM2, bfloat16, 2 cores): 8 ESConv histories, padded
    together, 2.1 s, alone 1.4 s; but 275 one- or two-turn safety cases alone 17.6 s against 6.6 s
    batched (per-call cost dominates short inputs).

    Shared starts (CPU, ``share``): the reads of one conversation (``RiskClassifier`` reads every prefix
    ending at a client turn, and a GRPO group's samples add their answers to one history) mostly begin
    with the same tokens. Renders whose first ``MIN_SHARED`` token ids are equal form a family: the
    longest runs once with a KV cache, and each other one runs only its tokens past the longest common
    start on that cache, cut back to it; its pooled states are the cached start's (a prefix sum) plus its
    tail's. Causal attention makes them the same states as its own pass up to summation order (tests:
    ``test_backbone_shares_the_reads_of_one_conversation``). Renders cut to ``MAX_CHARS`` begin elsewhere
    and run as before. ``tokens_read`` counts the tokens run through the layers.

    Lengths on a grid: every forward is padded on the right to ``escrag.shapes.bucket(n)`` tokens, and
    a shared read's tail starts at a multiple of 8 (K/V lengths on the grid too): with a shape per
    conversation length the counselor's memory kept growing under load."""

    def __init__(self, spec: str, layers: list[int], batch: int, device: str = "cpu", dtype: str = "bfloat16",
                 share: bool = True):
        import torch

        from escrag.models import load_causal_lm, load_tokenizer, resolve_device

        self.device, self.dtype = resolve_device(device), dtype
        self.tok, self.lm = load_tokenizer(spec), load_causal_lm(spec, "float32").eval().to(self.device)
        self.tok.padding_side = "right"
        if self.tok.pad_token is None:
            self.tok.pad_token = self.tok.eos_token
        n = self.lm.config.num_hidden_layers
        if any(not 1 <= k <= n for k in layers):
            from escrag.config import ConfigError

            raise ConfigError(f"safety.conv_layers: each must be in 1..{n} for {spec}, got {layers}")
        # the layers past the deepest one read (but one: the last hidden state is the normed one) and
        # the LM head are never needed: on SmolLM2 with layers up to 24 of 30, a third of the compute
        keep = min(n, max(layers) + 1)
        self.lm.model.layers = self.lm.model.layers[:keep]
        self.lm.config.num_hidden_layers = keep
        self.spec, self.layers, self.batch, self._torch = spec, list(layers), batch, torch
        self.share, self.tokens_read = share and self.device == "cpu", 0

    def features(self, histories: list[list[dict]], progress: str | None = None) -> np.ndarray:
        """``progress``: a progress bar with this label (for long passes)."""
        from escrag.progress import progress_bar

        texts = [render(h) for h in histories]
        out = [None] * len(texts)
        families = self._families(self.tok(texts)["input_ids"]) if self.share else []
        for ids, idx in progress_bar(families, desc=progress, unit="family", disable=progress is None):
            for i, row in zip(idx, self._shared_forward(ids)):
                out[i] = row
        alone = [i for i, row in enumerate(out) if row is None]
        for batch in progress_bar(self._batches([len(texts[i]) for i in alone]), desc=progress, unit="batch",
                                  disable=progress is None):
            idx = [alone[b] for b in batch]
            for i, row in zip(idx, self._forward([texts[i] for i in idx])):
                out[i] = row
        return np.stack(out) if out else np.zeros((0, len(self.layers) * self.lm.config.hidden_size), np.float32)

    @staticmethod
    def _families(ids: list[list[int]]) -> list[tuple[list[list[int]], list[int]]]:
        """(token ids, indices) of each family of two or more renders whose first ``MIN_SHARED`` ids
        agree, the longest first."""
        groups: dict[tuple, list[int]] = {}
        for i, t in enumerate(ids):
            if len(t) > MIN_SHARED:
                groups.setdefault(tuple(t[:MIN_SHARED]), []).append(i)
        families = []
        for idx in groups.values():
            if len(idx) > 1:
                idx = sorted(idx, key=lambda i: -len(ids[i]))
                families.append(([ids[i] for i in idx], idx))
        return families

    def _shared_forward(self, ids: list[list[int]]) -> np.ndarray:
        """Pooled states of a family (``ids``: the longest first): the longest with a KV cache, then each
        other one's tail past its common start with the longest, on the cache cut back to that start."""
        torch = self._torch
        from escrag.models import cache_kwarg

        decoder, kw = self.lm.model, cache_kwarg(self.lm.model)
        base = ids[0]
        tails = []
        for i, t in enumerate(ids[1:], 1):
            common = next((j for j, (a, b) in enumerate(zip(base, t)) if a != b), min(len(base), len(t)))
            tails.append((min(common, len(t) - 1) // 8 * 8, i))  # a token of its own; K/V lengths on the grid
        rows = [None] * len(ids)
        with torch.inference_mode(), torch.autocast(torch.device(self.device).type, dtype=torch.bfloat16,
                                                     enabled=self.dtype == "bfloat16"):
            first = decoder(input_ids=self._padded(base), use_cache=True, output_hidden_states=True)
            cache = getattr(first, kw)
            sums = [first.hidden_states[k][0].float().cumsum(0) for k in self.layers]  # prefix sums over tokens
            rows[0] = torch.cat([s[len(base) - 1] for s in sums]) / len(base)
            length = bucket(len(base))
            for start, i in sorted(tails, reverse=True):  # longest common start first: the cache only shrinks
                cache.crop(start - length)  # negative: tokens to drop (transformers 5.2x; before, a length from the end)
                tail, length = ids[i][start:], start + bucket(len(ids[i]) - start)
                pos = torch.arange(start, length, device=self.device).unsqueeze(0)
                hs = decoder(input_ids=self._padded(tail), position_ids=pos, use_cache=True,
                             output_hidden_states=True, **{kw: cache}).hidden_states
                rows[i] = torch.cat([s[start - 1] + hs[k][0, :len(tail)].float().sum(0)
                                     for s, k in zip(sums, self.layers)]) / len(ids[i])
                self.tokens_read += length - start
        self.tokens_read += bucket(len(base))
        return torch.stack(rows).cpu().numpy()

    def _batches(self, lengths: list[int]) -> list[list[int]]:
        """Indices in batches of similar length (sorted, at most ``batch``); on a CPU a batch also
        stops where padding would exceed ``PAD_SHARE`` of its real length (see the class doc)."""
        order = sorted(range(len(lengths)), key=lengths.__getitem__)
        batches: list[list[int]] = []
        for i in order:  # ascending, so lengths[i] is the padded length of the batch it joins
            b = batches[-1] if batches else []
            real = sum(lengths[j] for j in b) + lengths[i]
            padded_too_much = self.device == "cpu" and (len(b) + 1) * lengths[i] > (1 + PAD_SHARE) * real
            if not b or len(b) == self.batch or padded_too_much:
                batches.append([i])
            else:
                b.append(i)
        return batches

    def _padded(self, ids: list[int]):
        """One row of token ids padded on the right to ``bucket(len(ids))`` (causal: the padding after a
        token never changes its states)."""
        return self._torch.tensor([ids + [self.tok.pad_token_id] * (bucket(len(ids)) - len(ids))], device=self.device)

    def _forward(self, texts: list[str]) -> np.ndarray:
        torch = self._torch
        ids = self.tok(texts)["input_ids"]
        enc = self.tok.pad({"input_ids": ids}, padding="max_length", max_length=bucket(max(map(len, ids))),
                           return_tensors="pt").to(self.device)
        self.tokens_read += enc.input_ids.numel()
        with torch.inference_mode(), torch.autocast(torch.device(self.device).type, dtype=torch.bfloat16,
                                                     enabled=self.dtype == "bfloat16"):
            hs = self.lm.model(**enc, output_hidden_states=True).hidden_states
        mask = enc.attention_mask.unsqueeze(-1).float()
        pooled = [(hs[k].float() * mask).sum(1) / mask.sum(1) for k in self.layers]
        return torch.cat(pooled, dim=1).cpu().numpy()
