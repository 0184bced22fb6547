"""The tensor side of the transformers engine: a Llama-family forward over a slot KV cache.

Owns: ``SlotDecoder``. Each row of the running batch owns a slot of the KV cache (per layer
[slots, kv_heads, max_seq_len, head_dim] in the model's dtype) and keeps its own position there, so
rows of different lengths decode side by side with no padding and a row can enter a free slot while
the others keep decoding (continuous batching, ``rollout/hf_engine.py``). ``prefill`` runs one prompt
into one slot (eager; K/V of a cached prefix can be copied in first, ``copy``/``restore``);
``decode`` runs one token for slots [0, n) and samples inside the step (``escrag.sampling.sample``),
compiled with ``torch.compile`` once per (batch bucket, length bucket, sampling parameters).

Why not HF's forward with a ``StaticCache``: its cache writes one position for the whole batch, and
its sdpa path copies grouped-query K/V per head under compile (design section 5). The forward here
calls the model's own modules (embedding, rotary embedding, norms, projections, MLP, head) and only
lays out attention itself; tests compare it with HF's forward.

- Grouped queries: the G query heads that share a K/V head attend as G query rows of that head, so
  attention reads each K/V head once and copies nothing.
- Masks: a token at position p attends cache positions 0..p of its slot. Positions past p may hold
  stale K/V of an earlier row or of padding rows; they are never read, since a row writes a position
  before it attends it.
- Buckets: ``decode`` pads n live rows up to the next batch bucket (padding rows compute at position
  0 of free slots) and reads the cache up to the next multiple of ``length_bucket``; each bucket pair
  is compiled once and reused. The layer is a nested compile region: compiled once per graph and
  stamped out for every layer (about a quarter of the compile time of a flat graph, same step time).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from escrag.models import ModelSpecError
from escrag.sampling import sample

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral")


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding in HF's half-rotation layout (Llama, Qwen2, Qwen3, Mistral)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def check_model(model, max_seq_len: int) -> None:
    """Raise ``ModelSpecError`` unless ``model`` has the layout this forward implements."""
    cfg = model.config
    if cfg.model_type not in SUPPORTED_MODEL_TYPES:
        raise ModelSpecError(f"model_type {cfg.model_type!r}: the transformers engine decodes "
                             f"{', '.join(SUPPORTED_MODEL_TYPES)} models; use rollout.engine: vllm")
    window = getattr(cfg, "sliding_window", None)
    if window and getattr(cfg, "use_sliding_window", True) and window < max_seq_len:
        raise ModelSpecError(f"sliding-window attention ({window} tokens) < rollout.max_seq_len "
                             f"({max_seq_len}): not supported by the transformers engine")


def next_bucket(n: int, buckets: list[int]) -> int:
    """The smallest bucket >= n (buckets sorted ascending; the last one is the largest allowed)."""
    for b in buckets:
        if b >= n:
            return b
    raise ValueError(f"{n} rows > the largest batch bucket {buckets[-1]}")


class SlotDecoder:
    """K/V slots plus the prefill and decode passes of one causal LM (``model`` in eval mode)."""

    def __init__(self, model, ro):
        check_model(model, ro.max_seq_len)
        cfg = model.config
        self.model, self.inner = model, model.model
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.max_seq_len, self.length_bucket = ro.max_seq_len, ro.length_bucket
        self.batch_buckets = sorted({b for b in ro.batch_buckets if b < ro.max_batch} | {ro.max_batch})
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.keys: list[torch.Tensor] = []  # per layer [slots, kv_heads, max_seq_len, head_dim]
        self.values: list[torch.Tensor] = []
        self.slots = 0
        self.compiled = ro.compile
        self._step = self._decode_step
        if ro.compile:
            import torch._dynamo

            # one graph per (batch bucket, length bucket, sampling params); dynamo's default limit is 8
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 256)
            torch._dynamo.config.accumulated_recompile_limit = max(
                torch._dynamo.config.accumulated_recompile_limit, 1024)
            self._step = torch.compile(self._decode_step, dynamic=False)

    # ------------------------------------------------------------------ slots

    def reserve(self, n: int) -> None:
        """Make room for ``n`` slots (grown to a batch bucket; existing slots keep their K/V)."""
        if n <= self.slots:
            return
        size = next_bucket(n, self.batch_buckets)
        shape = (size, self.kv_heads, self.max_seq_len, self.head_dim)
        for cache in (self.keys, self.values):
            for i in range(len(self.inner.layers)):
                new = torch.zeros(shape, dtype=self.dtype, device=self.device)
                if self.slots:
                    new[:self.slots] = cache[i][:self.slots]
                if i < len(cache):
                    cache[i] = new
                else:
                    cache.append(new)
        self.slots = size

    def copy(self, src: int, dst: int, length: int) -> None:
        """K/V of positions [0, length) of slot ``src`` into slot ``dst``."""
        for cache in (*self.keys, *self.values):
            cache[dst, :, :length] = cache[src, :, :length]

    def save(self, slot: int, length: int) -> torch.Tensor:
        """A copy of positions [0, length) of ``slot``: [2 * layers, kv_heads, length, head_dim]."""
        return torch.stack([cache[slot, :, :length] for cache in (*self.keys, *self.values)])

    def restore(self, saved: torch.Tensor, dst: int, length: int) -> None:
        """Positions [0, length) of a ``save``d copy into slot ``dst``."""
        for cache, part in zip((*self.keys, *self.values), saved):
            cache[dst, :, :length] = part[:, :length]

    # ------------------------------------------------------------------ passes

    @torch.inference_mode()
    def prefill(self, slot: int, ids: list[int], start: int) -> torch.Tensor:
        """Run ``ids[start:]`` at positions start.. of ``slot`` (positions < start already hold the
        K/V of ``ids[:start]``); returns the logits after the last token, [1, vocab] float32."""
        x = torch.tensor([ids[start:]], device=self.device)
        pos = torch.arange(start, len(ids), device=self.device)[None]
        keys = [k[slot:slot + 1] for k in self.keys]
        values = [v[slot:slot + 1] for v in self.values]
        hidden = self._forward(x, pos, keys, values, len(ids))
        return self._logits(hidden[:, -1]).float()

    @torch.inference_mode()
    def decode(self, tokens: list[int], positions: list[int], seeds: list[int], steps: list[int],
               temperature: float, top_p: float, top_k: int) -> tuple[list[int], list[float]]:
        """One decode step for slots [0, n): feed ``tokens`` at ``positions``, sample with the
        rows' ``seeds`` at their decode ``steps``; returns the n sampled tokens and log-probs."""
        n = len(tokens)
        b = next_bucket(n, self.batch_buckets)
        pad = b - n
        length = min(self.max_seq_len, -(-(max(positions) + 1) // self.length_bucket) * self.length_bucket)
        ints = torch.tensor([tokens + [0] * pad, positions + [0] * pad, seeds + [0] * pad, steps + [0] * pad],
                            dtype=torch.long, device=self.device)
        keys = [k[:b, :, :length] for k in self.keys]
        values = [v[:b, :, :length] for v in self.values]
        tok, logp = self._step(ints[0], ints[1], ints[2], ints[3], keys, values, temperature, top_p, top_k)
        return tok[:n].tolist(), logp[:n].tolist()

    def _decode_step(self, tokens, positions, seeds, steps, keys, values, temperature, top_p, top_k):
        hidden = self._forward(tokens[:, None], positions[:, None], keys, values, keys[0].shape[2])
        return sample(self._logits(hidden[:, -1]), temperature, top_p, top_k, seeds, steps)

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.lm_head(self.inner.norm(hidden))

    def _forward(self, ids, pos, keys, values, kv_len: int) -> torch.Tensor:
        """ids, pos [n, T] -> hidden [n, T, E]; writes the K/V of these positions into ``keys`` /
        ``values`` ([n, kv_heads, >= kv_len, head_dim] views of the slots) and attends cache positions
        0..pos of each row."""
        n, t = ids.shape
        x = self.inner.embed_tokens(ids)
        cos, sin = self.inner.rotary_emb(x, pos)
        cos, sin = cos[:, None], sin[:, None]  # [n, 1, T, D]: broadcast over heads
        mask = torch.arange(kv_len, device=ids.device) <= pos[..., None]  # [n, T, kv_len]
        groups = self.heads // self.kv_heads
        mask = mask[:, None, None].expand(n, 1, groups, t, kv_len).reshape(n, 1, groups * t, kv_len)
        rows = torch.arange(n, device=ids.device)[:, None]
        for layer, k_cache, v_cache in zip(self.inner.layers, keys, values):
            x = _layer(layer, x, cos, sin, mask, k_cache, v_cache, rows, pos, self.heads, self.kv_heads)
        return x


@torch.compiler.nested_compile_region  # under torch.compile: compiled once, reused for every layer
def _layer(layer, x, cos, sin, mask, k_cache, v_cache, rows, pos, heads: int, kv_heads: int):
    """One decoder layer: attention over the slot cache, then the MLP (pre-norm residuals)."""
    attn, (n, t, _) = layer.self_attn, x.shape
    h = layer.input_layernorm(x)
    q = attn.q_proj(h).view(n, t, heads, -1)
    k = attn.k_proj(h).view(n, t, kv_heads, -1)
    v = attn.v_proj(h).view(n, t, kv_heads, -1)
    if hasattr(attn, "q_norm"):  # Qwen3
        q, k = attn.q_norm(q), attn.k_norm(k)
    q = _rope(q.transpose(1, 2), cos, sin)  # [n, H, T, D]
    k = _rope(k.transpose(1, 2), cos, sin)
    k_cache[rows, :, pos] = k.transpose(1, 2)  # [n, T, kv_heads, D] at each row's positions
    v_cache[rows, :, pos] = v
    kv_len, head_dim = mask.shape[-1], q.shape[-1]
    q = q.reshape(n, kv_heads, heads // kv_heads * t, head_dim)
    out = F.scaled_dot_product_attention(q, k_cache[:, :, :kv_len], v_cache[:, :, :kv_len],
                                         attn_mask=mask, scale=attn.scaling)
    out = out.view(n, heads, t, head_dim).transpose(1, 2).reshape(n, t, -1)
    x = x + attn.o_proj(out)
    return x + layer.mlp(layer.post_attention_layernorm(x))
