"""The conversation head's reader: ``Backbone`` (a language model's hidden states over a rendered
conversation) and ``render`` (the text it reads)."""

from __future__ import annotations

import numpy as np

QUESTION = ("\n\nQuestion: Is anyone in this conversation in immediate danger of suicide, self-harm, "
            "violence, abuse or a medical emergency? Answer:")
MAX_CHARS = 2000  # the conversation's last characters that are read (the question is always whole)
PAD_SHARE = 0.1  # on a CPU, the most padding a batch may add to its real length (characters)


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
    batched (per-call cost dominates short inputs)."""

    def __init__(self, spec: str, layers: list[int], batch: int, device: str = "cpu", dtype: str = "bfloat16"):
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

    def features(self, histories: list[list[dict]], progress: str | None = None) -> np.ndarray:
        """``progress``: a progress bar with this label (for long passes)."""
        from tqdm import tqdm

        texts = [render(h) for h in histories]
        out = [None] * len(texts)
        for idx in tqdm(self._batches([len(t) for t in texts]), desc=progress, unit="batch",
                        disable=progress is None):
            for i, row in zip(idx, self._forward([texts[i] for i in idx])):
                out[i] = row
        return np.stack(out) if out else np.zeros((0, len(self.layers) * self.lm.config.hidden_size), np.float32)

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

    def _forward(self, texts: list[str]) -> np.ndarray:
        torch = self._torch
        enc = self.tok(texts, return_tensors="pt", padding=True).to(self.device)
        with torch.inference_mode(), torch.autocast(torch.device(self.device).type, dtype=torch.bfloat16,
                                                     enabled=self.dtype == "bfloat16"):
            hs = self.lm.model(**enc, output_hidden_states=True).hidden_states
        mask = enc.attention_mask.unsqueeze(-1).float()
        pooled = [(hs[k].float() * mask).sum(1) / mask.sum(1) for k in self.layers]
        return torch.cat(pooled, dim=1).cpu().numpy()
