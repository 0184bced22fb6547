"""The tensor side of the transformers engine: a Llama-family forward over a slot KV cache.

Owns: ``SlotDecoder``. Each row of the running batch owns a slot of the KV cache (per layer
[slots, kv_heads, max_seq_len, head_dim] in the model's dtype) and keeps its own position there, so
rows of different lengths decode side by side with no padding and a row can enter a free slot while
the others keep decoding (continuous batching, ``rollout/engines/hf_engine.py``). ``prefill`` runs the prompts
of rows entering consecutive slots in one pass, their tokens packed with no padding (K/V of a cached
prefix can be copied in first, ``copy``/``restore``); ``decode`` runs one token for slots [0, n) and
samples inside the step (``escrag.sampling.sample``). With ``rollout.compile`` the step is compiled
with ``torch.compile``, once per sampling parameters (temperature, top-p, top-k): where the layers run
as native calls (below) only the LM head and the sampler, else the whole step; the prefill stays
eager (``prefill``).

Why not HF's forward with a ``StaticCache``: its cache writes one position for the whole batch, and
its sdpa path copies grouped-query K/V per head under compile (design section 5). The forward here
calls the model's own modules (embedding, rotary embedding, norms, projections, MLP, head) and only
lays out attention itself; tests compare it with HF's forward.

- Grouped queries: the G query heads that share a K/V head attend as G query rows of that head, so
  attention reads each K/V head once and copies nothing.
- Attention: on a CPU in float32 and bfloat16, the native kernels of ``cpu_attention.py`` (a decode
  row reads its own positions 0..p; a packed prefill token its slot's positions 0..its own; no mask,
  no padding); elsewhere SDPA with a mask.
- Native layers (``_native_layers``): on a CPU with packed linears and the kernels, for HF's RMSNorm and
  SiLU MLP without q/k norms (Llama, Qwen2, Mistral; SmolLM2), a decode step runs each layer as 8
  calls: 4 packed linears and 4 native ones (norm; rotary embedding + cache writes + attention; residual
  add + norm; the activation's product) instead of ~45 torch ops, each a few microseconds of Python and
  dispatch. SmolLM2 bf16 batch 8 on this CPU: 16.6-17.4 -> 13.5-14.1 ms a step eagerly; as fast as the
  whole step compiled, which compiles 15-25 s longer. Other models keep the torch ops below.
- Masks: a token at position p attends cache positions 0..p of its slot (its prompt starts at
  position 0). Positions past p may hold K/V of an earlier occupant of the slot: finite values (the
  cache starts zeroed) that the mask weighs 0; a row writes a position before it attends it.
- Shapes: ``decode`` runs exactly the n live rows (through SDPA, reading the cache up to the longest
  row's position, rounded up to ``LENGTH_STEP``); n, that length and the slot count are dynamic
  dimensions of one compiled graph (plus one for n = 1). Measured on SmolLM2-135M (bf16, this CPU): as fast per
  step as graphs specialised to batch buckets and 256-token length buckets (faster where those pad),
  and compiled once instead of once per bucket. A packed linear over more than ``GRID_ROWS`` rows (a
  prefill's tokens, any number; a decode step past 8 rows) runs them padded to ``escrag.shapes.bucket``'s
  grid: oneDNN caches a primitive per row count, which grew a server's memory with every new prompt length.
- Compile time (the whole-step graph): the two halves of a layer (``_qkv``, ``_attend_and_mlp``) are nested compile regions,
  compiled once and stamped out for every layer (a quarter of a flat graph's compile time, same step
  time); the cache writes stay between them, since a nested region that mutates its inputs loses the
  dynamic batch size (torch 2.13).
"""

from __future__ import annotations

import itertools
import platform
import weakref

import torch
import torch._dynamo
import torch.nn.functional as F

from escrag.models import ModelSpecError
from escrag.sampling import sample
from escrag.shapes import bucket
from rollout.engines import cpu_attention

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral")
LENGTH_STEP = 16  # the attended cache length is rounded up to a multiple of this
GRID_ROWS = 8  # a packed linear over more rows than this runs them padded to escrag.shapes.bucket


def _rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding in HF's half-rotation layout (Llama, Qwen2, Qwen3, Mistral): x * cos +
    rotate_half(x) * sin, rotate_half(x) = [-x2, x1], as x rolled by half with the sign folded into
    ``signed_sin`` = [-sin1, sin2] (``_forward``): HF's products and sum exactly, in 4 ops instead of 7."""
    return x * cos + x.roll(x.shape[-1] // 2, -1) * signed_sin


def _round_up(n: int) -> int:
    return -(-n // LENGTH_STEP) * LENGTH_STEP


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


class SlotDecoder:
    """K/V slots plus the prefill and decode passes of one causal LM (``model`` in eval mode)."""

    def __init__(self, model, ro):
        check_model(model, ro.max_seq_len)
        cfg = model.config
        self.model, self.inner = model, model.model
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.max_seq_len, self.max_batch = ro.max_seq_len, ro.max_batch
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.keys: list[torch.Tensor] = []  # per layer [slots, kv_heads, max_seq_len, head_dim]
        self.values: list[torch.Tensor] = []
        self.slots = 0
        self.compiled = ro.compile
        self.fixed_rows = ro.max_batch if ro.batch_invariant else 0  # every decode step runs this many rows
        self.packed = self.device.type == "cpu" and cpu_packing(self.dtype)
        # attention by the native kernels (cpu_attention.py); None: SDPA over a mask
        self.kernel = (cpu_attention.kernel(self.dtype, self.head_dim, self.heads // self.kv_heads)
                       if self.device.type == "cpu" else None)
        self.fused: list[tuple] = []  # per layer (qkv, gate_up): FusedLinear keys and biases (packed path)
        self._fused: dict[int, FusedLinear] = {}  # member weight or bias data_ptr -> its fused linear
        if self.packed:
            for layer in self.inner.layers:
                a, mlp = layer.self_attn, layer.mlp
                qkv, gate_up = FusedLinear([a.q_proj, a.k_proj, a.v_proj]), FusedLinear([mlp.gate_proj, mlp.up_proj])
                self.fused.append((qkv.key, qkv.bias, gate_up.key, gate_up.bias))
                for f in (qkv, gate_up):
                    self._fused.update({t.data_ptr(): f for t in f.members()})
            for m in model.modules():
                if isinstance(m, torch.nn.Linear) and m.weight.data_ptr() not in self._fused:
                    pack_weight(m.weight)
        # decode steps run each layer's small ops as native calls (``_native_layers``)
        self.native_layers = (self.packed and self.kernel is not None
                              and getattr(cfg, "hidden_act", None) in ("silu", "swish")
                              and all(native_norm(m) for m in model.modules() if "RMSNorm" in type(m).__name__)
                              and not hasattr(self.inner.layers[0].self_attn, "q_norm"))
        self._step, self._head = self._decode_step, self._sample_head
        if ro.compile:
            # one graph per sampling params (and one for a batch of 1); dynamo's default limit is 8
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
            if self.native_layers:  # the layers are native calls already: the head and sampler compile
                self._head = torch.compile(self._sample_head, dynamic=False)
            else:
                self._step = torch.compile(self._decode_step, dynamic=False)

    # ------------------------------------------------------------------ slots

    @torch.inference_mode(False)  # normal tensors, also when a pass reserves: copy() writes them outside
    def reserve(self, n: int) -> None:
        """Make room for ``n`` slots (at least doubling, up to ``max_batch``, or n when more; existing
        slots keep their K/V). The slot dimension is outermost, so views of [:n] keep their strides."""
        if n <= self.slots:
            return
        size = min(max(n, 2, 2 * self.slots), max(n, 2, self.max_batch))
        # one LENGTH_STEP of slack: the attended length never reaches the allocated one (a full-length
        # view has other strides and would compile a second graph)
        shape = (size, self.kv_heads, self.cache_len, self.head_dim)
        for cache in (self.keys, self.values):
            for i in range(len(self.inner.layers)):
                new = torch.zeros(shape, dtype=self.dtype, device=self.device)
                if self.compiled:  # a larger cache does not recompile the decode step
                    torch._dynamo.maybe_mark_dynamic(new, 0)
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

    def repack(self, weights: list[torch.Tensor]) -> None:
        """Refresh the oneDNN-packed copies of those of ``weights`` that have one (after an in-place
        weight load)."""
        for f in {id(f): f for w in weights if (f := self._fused.get(w.data_ptr()))}.values():
            f.refresh()
        for w in weights:
            if w.data_ptr() in _PACKED:
                pack_weight(w)

    # ------------------------------------------------------------------ passes

    @property
    def cache_len(self) -> int:
        """Positions per slot (a row's prompt + completion + padding of a batched prefill fit)."""
        return _round_up(self.max_seq_len) + LENGTH_STEP

    @torch.inference_mode()
    def prefill(self, first: int, prompts: list[list[int]], starts: list[int]) -> torch.Tensor:
        """Run ``prompts[i][starts[i]:]`` at positions starts[i].. of slot ``first + i`` (positions
        below start already hold the K/V of the prefix), all rows in one pass; returns the logits after
        each prompt's last token, [n, vocab] float32. The rows' tokens run packed, with no padding,
        through the projections, norms and MLP (most of a pass) and the native attention; only SDPA
        (no kernel) lays them out as [rows, longest row] (``_gather``). It runs eagerly, also with ``rollout.compile``: its GEMMs
        dominate it, and a compiled pass would need a graph of its own (packed, that graph failed to
        run in torch 2.13's inductor: a nested region's size symbol went unbound)."""
        rows, n = [p[s:] for p, s in zip(prompts, starts)], len(prompts)
        kv_len = max(s + len(r) for s, r in zip(starts, rows))  # the furthest position attended, + 1
        if kv_len > self.cache_len:
            raise ValueError(f"prefill past the cache: {kv_len} positions > {self.cache_len}")
        ends = list(itertools.accumulate(map(len, rows)))  # packed index after each row's last token
        dev = self.device
        ids = torch.tensor([x for r in rows for x in r], device=dev)[None]  # [1, N]
        pos = torch.tensor([s + j for s, r in zip(starts, rows) for j in range(len(r))], device=dev)[None]
        written = torch.tensor([first + i for i, r in enumerate(rows) for _ in r], device=dev)[None]
        if self.kernel is not None:  # each token attends its own slot's positions 0..its position
            hidden = self._forward(ids, pos, None, written)
        else:
            gather = self._gather(rows, ends) if n > 1 else None
            row_pos = pos[0][gather[0]] if gather else pos  # [n, t]: a padding position repeats the last
            mask = torch.arange(kv_len, device=dev) <= row_pos[..., None]
            slots = torch.arange(first, first + n, device=dev)
            hidden = self._forward(ids, pos, mask, written, slots, gather)
        return self._logits(hidden[0, torch.tensor(ends, device=dev) - 1]).float()

    def _gather(self, rows: list[list[int]], ends: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Attention's layout of a packed pass: ``pad`` [n, t] (t: the longest row) picks row i's
        tokens out of the packed ones, its last token again past its end; ``unpad`` [N] picks the
        packed tokens back out of [n * t]."""
        t = max(map(len, rows))
        pad = [[e - len(r) + min(j, len(r) - 1) for j in range(t)] for r, e in zip(rows, ends)]
        unpad = [i * t + j for i, r in enumerate(rows) for j in range(len(r))]
        return torch.tensor(pad, device=self.device), torch.tensor(unpad, device=self.device)

    @torch.inference_mode()
    def decode(self, tokens: list[int], positions: list[int], seeds: list[int], steps: list[int],
               temperature: float, top_p: float, top_k: int) -> tuple[list[int], list[float]]:
        """One decode step for slots [0, n): feed ``tokens`` at ``positions``, sample with the
        rows' ``seeds`` at their decode ``steps``; returns the n sampled tokens and log-probs."""
        n = len(tokens)
        # padding rows write position 0 of free slots: compiled, n = 1 would compile a second graph;
        # batch-invariant, every step runs max_batch rows (hf_engine.py)
        pad = max(self.fixed_rows, 2 if self.compiled else 1) - n
        if pad > 0:
            self.reserve(n + pad)
            tokens, positions, seeds, steps = ([*x, *[0] * pad] for x in (tokens, positions, seeds, steps))
        if max(positions) >= self.cache_len or min(positions) < 0:
            raise ValueError(f"decode positions {min(positions)}..{max(positions)} outside the cache "
                             f"(0..{self.cache_len - 1})")
        ints = [torch.tensor(x, dtype=torch.long, device=self.device) for x in (tokens, positions, seeds, steps)]
        mask = None
        if self.kernel is None:  # SDPA: [n, 1, length] (the native kernel reads each row's own length)
            length = _round_up(max(positions) + 1)
            mask = (torch.arange(length, device=self.device) <= ints[1][:, None])[:, None]
        if self.compiled:  # one graph for every batch size and attended length (slots: ``reserve``);
            # batch-invariant too: its row count never changes, and the graph a rollout compiled serves it
            for t in ints:
                torch._dynamo.maybe_mark_dynamic(t, 0)
            if mask is not None:
                torch._dynamo.maybe_mark_dynamic(mask, 0)
                torch._dynamo.maybe_mark_dynamic(mask, 2)
        tok, logp = self._step(*ints, mask, temperature, top_p, top_k)
        return tok[:n].tolist(), logp[:n].tolist()

    def _decode_step(self, tokens, positions, seeds, steps, mask, temperature, top_p, top_k):
        hidden = self._forward(tokens[:, None], positions[:, None], mask)[:, -1]
        if self.compiled and not torch.compiler.is_compiling():  # only the head is compiled
            torch._dynamo.maybe_mark_dynamic(hidden, 0)
        return self._head(hidden, temperature, top_p, top_k, seeds, steps)

    def _sample_head(self, hidden, temperature, top_p, top_k, seeds, steps):
        return sample(self._logits(hidden), temperature, top_p, top_k, seeds, steps)

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return _linear(self.model.lm_head, self.inner.norm(hidden), self.packed)

    def _forward(self, ids, pos, mask, written=None, slots=None, gather=None) -> torch.Tensor:
        """ids, pos [b, T] -> hidden [b, T, E]; writes the K/V of each token at its position of its
        slot (``written``, like ids; None: row i of slot i) and attends it to the cache positions
        ``mask`` allows ([n, t, kv_len] bool: 0..pos) of the slots ``slots`` ([n]; None: 0..n);
        ``mask`` None: through the native kernels, each token attending positions 0..its position of its
        slot. Decode: n rows of one token (b = n, T = 1). Prefill: b = 1 and the pass's tokens packed;
        ``gather`` (``_gather``) lays them out as [n, t] for SDPA (None: one row, t = T)."""
        x = self.inner.embed_tokens(ids)
        cos, sin = self.inner.rotary_emb(x, pos)  # [b, T, D]
        half = sin.shape[-1] // 2
        sin = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)  # signed (``_rope``)
        cos, sin = cos[:, :, None], sin[:, :, None]  # [b, T, 1, D]: broadcast over heads
        native = None if mask is not None else (written, pos)  # read before ``written`` is filled in
        if mask is not None:
            n, t, kv_len = mask.shape
            groups = self.heads // self.kv_heads
            mask = mask[:, None, None].expand(n, 1, groups, t, kv_len).reshape(n, 1, groups * t, kv_len)
            # additive: SDPA would turn a bool mask into this in every layer
            mask = torch.zeros(mask.shape, dtype=x.dtype, device=x.device).masked_fill_(~mask, float("-inf"))
        if native is not None and written is None and self.native_layers:
            return self._native_layers(x, cos, sin, pos)
        if written is None:  # decode: row i of slot i
            written = torch.arange(ids.shape[0], device=ids.device)[:, None]
        # eager, the layer halves run as plain functions: a nested region or a custom op costs a few
        # microseconds a call in Python, ~4 ms of a 30 ms decode step
        qkv, attend = (_qkv, _attend_and_mlp) if torch.compiler.is_compiling() else (_qkv_fn, _attend_and_mlp_fn)
        for i, (layer, k_cache, v_cache) in enumerate(zip(self.inner.layers, self.keys, self.values)):
            fused = self.fused[i] if self.fused else None
            q, k, v = qkv(layer, x, cos, sin, self.heads, self.kv_heads, fused)
            k_cache[written, :, pos] = k  # [b, T, kv_heads, D] at each token's slot and position
            v_cache[written, :, pos] = v
            if native is not None:
                keys, values = k_cache, v_cache
            elif slots is None:
                keys, values = k_cache[:n, :, :kv_len], v_cache[:n, :, :kv_len]
            else:
                keys, values = k_cache[slots, :, :kv_len], v_cache[slots, :, :kv_len]
            x = attend(layer, x, q, keys, values, mask, native, self.heads, self.kv_heads, fused, gather)
        return x

    def _native_layers(self, x, cos, sin, pos) -> torch.Tensor:
        """The layers of a decode step (x [n, 1, E]; with ``rollout.compile`` too, only the head is
        compiled there), each as 8 calls: norm, q/k/v projection, ``decode_layer_fn`` (rotary embedding,
        cache writes, attention), output projection, residual add and norm, gate/up projection, the
        activation's product, down projection (its residual add goes into the next layer's norm). The
        same math as ``_qkv_fn`` / ``_attend_and_mlp_fn`` with the small ops in C: eagerly, each torch op
        costs a few microseconds of Python and dispatch, ~45 a layer."""
        lib, n = self.kernel, x.shape[0]
        x, cos, sin, pos = x.view(n, -1), cos.reshape(n, -1), sin.reshape(n, -1), pos.view(n)
        res = None
        for layer, fused, k_cache, v_cache in zip(self.inner.layers, self.fused, self.keys, self.values):
            attn, mlp = layer.self_attn, layer.mlp
            norm1, norm2 = layer.input_layernorm, layer.post_attention_layernorm
            x, h = cpu_attention.rms_norm_fn(lib, x, res, norm1.weight, norm1.variance_epsilon)
            out = cpu_attention.decode_layer_fn(lib, _packed_linear_fn(h, fused[0], fused[1]), cos, sin, k_cache,
                                                v_cache, pos, attn.scaling, self.heads)
            x, h = cpu_attention.rms_norm_fn(lib, x, _linear(attn.o_proj, out, True), norm2.weight,
                                             norm2.variance_epsilon)
            res = _linear(mlp.down_proj, cpu_attention.silu_mul_fn(lib, _packed_linear_fn(h, fused[2], fused[3])), True)
        return (x + res)[:, None]


def native_norm(module) -> bool:
    """Whether ``module`` is HF's RMSNorm (Llama, Qwen2, Qwen3, Mistral: w * (x * rsqrt(mean(x^2) + eps)),
    the normalised row in the model's dtype before the product), which ``cpu_attention.rms_norm_fn`` computes."""
    return type(module).__name__ in ("LlamaRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "MistralRMSNorm") and \
        hasattr(module, "variance_epsilon")


# Under torch.compile each of these is compiled once and stamped out for every layer. The cache
# writes stay outside them: nested regions that mutate their inputs lose the dynamic batch size.
def _qkv_fn(layer, x, cos, sin, heads: int, kv_heads: int, fused: tuple | None):
    """Pre-norm, projections (one fused matmul on the packed path), rotary embedding: q [n, H, T, D];
    k, v [n, T, kv_heads, D]."""
    attn, (n, t, _) = layer.self_attn, x.shape
    h = layer.input_layernorm(x)
    if fused is not None:
        sizes = [attn.q_proj.out_features, attn.k_proj.out_features, attn.v_proj.out_features]
        q, k, v = _packed(h, fused[0], fused[1]).split_with_sizes(sizes, dim=-1)
        v = v.contiguous()  # a region's output must not be a view of its intermediate (torch 2.13: NaN)
    else:
        q, k, v = attn.q_proj(h), attn.k_proj(h), attn.v_proj(h)
    q, k, v = q.view(n, t, heads, -1), k.view(n, t, kv_heads, -1), v.view(n, t, kv_heads, -1)
    if hasattr(attn, "q_norm"):  # Qwen3
        q, k = attn.q_norm(q), attn.k_norm(k)
    return _rope(q, cos, sin).transpose(1, 2), _rope(k, cos, sin), v


def _attend_and_mlp_fn(layer, x, q, keys, values, mask, native, heads: int, kv_heads: int, fused: tuple | None,
                       gather: tuple | None):
    """Attention of q over the rows' cached K/V, then the output projection and the MLP, with pre-norm
    residuals. ``native`` (written, pos), ``keys``/``values`` the whole caches: the native kernels
    (decode, ``written`` None: row i of slot i; prefill: packed tokens, causal). Else SDPA over
    ``mask``: grouped queries as rows of their K/V head; packed tokens laid out as rows by ``gather``
    and packed back after."""
    attn, head_dim = layer.self_attn, q.shape[-1]
    if native is not None and native[0] is None:  # decode: q [n, H, 1, D]
        decode = cpu_attention.decode_attention if torch.compiler.is_compiling() else cpu_attention.decode_fn
        out = decode(q.reshape(x.shape[0], heads, head_dim), keys, values, native[1][:, 0], attn.scaling)
        out = out.view(x.shape)
    elif native is not None:  # prefill (eager): q [1, H, N, D]
        out = cpu_attention.prefill_fn(q[0].transpose(0, 1), keys, values, native[0][0], native[1][0], attn.scaling)
        out = out.view(x.shape)
    else:
        n, t = mask.shape[0], mask.shape[2] // (heads // kv_heads)
        if gather is not None:
            q = q[0][:, gather[0]].transpose(0, 1)  # [1, H, N, D] -> [n, H, t, D]
        q = q.reshape(n, kv_heads, heads // kv_heads * t, head_dim)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=attn.scaling)
        out = out.view(n, heads, t, head_dim).transpose(1, 2).reshape(n, t, -1)
        if gather is not None:
            out = out.reshape(n * t, -1)[gather[1]][None]
    packed = fused is not None
    x = x + _linear(attn.o_proj, out, packed)
    mlp, h = layer.mlp, layer.post_attention_layernorm(x)  # Llama-family MLP: down(act(gate) * up)
    if packed:
        gate, up = _packed(h, fused[2], fused[3]).chunk(2, dim=-1)
    else:
        gate, up = mlp.gate_proj(h), mlp.up_proj(h)
    return x + _linear(mlp.down_proj, mlp.act_fn(gate) * up, packed)


_qkv = torch.compiler.nested_compile_region(_qkv_fn)
_attend_and_mlp = torch.compiler.nested_compile_region(_attend_and_mlp_fn)


# ------------------------------------------------------------------ oneDNN-packed linears (CPU)
# A bfloat16 matmul on the CPU reorders its weight into oneDNN's blocked layout on every call; packed
# once, the layers' linears run 1.1-1.9x faster (most at small batches: 1.6x at 8 rows on this CPU).
# A float32 matmul goes to MKL, which on this AMD CPU runs SmolLM2's linears at 11 GB/s at 8 rows
# (oneDNN packed: 30 GB/s) and at half oneDNN's rate at 1,360 rows (a prefill); packed, the whole
# float32 engine runs ~2x faster (bench/bench_engine.py).
# A custom op, so that compiled graphs call it too and read the packed copies of the weights as they
# are when the graph runs (``SlotDecoder.repack`` after an in-place weight load).

_PACKED: dict[int, torch.Tensor] = {}  # weight data_ptr -> its oneDNN-packed copy


def cpu_packing(dtype: torch.dtype) -> bool:
    """Whether the engine packs its linears for oneDNN: float32 on x86-64 (oneDNN's JIT kernels; on
    other CPUs, Arm among them, its float32 path may be a reference loop, so ``F.linear`` stays);
    bfloat16 where oneDNN's bf16 check passes (AVX512 bw/vl/dq or AVX-NE-CONVERT on x86: on an
    AVX2-only CPU ``_reorder_linear_weight`` raises, so the engine keeps plain ``F.linear`` there)."""
    if not torch.backends.mkldnn.is_available():
        return False
    if dtype == torch.float32:
        return platform.machine().lower() in ("x86_64", "amd64")
    return dtype == torch.bfloat16 and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def pack_weight(weight: torch.Tensor) -> None:
    ptr = weight.data_ptr()
    if ptr not in _PACKED:
        weakref.finalize(weight, _PACKED.pop, ptr, None)  # dropped with the weight
    _PACKED[ptr] = torch.ops.mkldnn._reorder_linear_weight(weight.detach())


def _packed_linear_fn(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` through the packed copy of ``weight``. Past ``GRID_ROWS`` rows the
    rows are padded with zeros to ``escrag.shapes.bucket``'s grid: oneDNN keeps a primitive per row
    count, and a prefill's count is any number."""
    rows = x.reshape(-1, x.shape[-1])
    m = rows.shape[0]
    if m > GRID_ROWS and bucket(m) != m:
        rows = torch.cat([rows, rows.new_zeros(bucket(m) - m, rows.shape[1])])
    out = torch.ops.mkldnn._linear_pointwise(rows, _PACKED[weight.data_ptr()], bias, "none", [], "")
    return out[:m].reshape(*x.shape[:-1], weight.shape[0])


# Defined through ``torch.library.Library``, not ``custom_op``: the latter's Python wrapper costs ~7 µs
# a call (microbenchmark); the op's own time in a compiled bfloat16 step at batch 8 (121 calls) went
# from 1.26 to 0.86 ms.
_LIB = torch.library.Library("escrag", "DEF")
_LIB.define("packed_linear(Tensor x, Tensor weight, Tensor? bias) -> Tensor")
_LIB.impl("packed_linear", _packed_linear_fn, "CPU")
packed_linear = torch.ops.escrag.packed_linear.default


@torch.library.register_fake("escrag::packed_linear")
def _(x, weight, bias):
    return x.new_empty(*x.shape[:-1], weight.shape[0])


class FusedLinear:
    """Linears that read the same input (q/k/v, gate/up) as one packed matmul over their concatenated
    weights: 3 and 2 oneDNN calls become one each (at batch 8 a SmolLM2 projection is a few dozen
    microseconds, mostly per-call cost). ``key`` stands for the fused weight in ``packed_linear`` (its
    shape gives the output size); ``refresh`` re-packs after the members' weights change in place."""

    def __init__(self, linears: list[torch.nn.Linear]):
        self.linears = linears
        w = linears[0].weight
        self.key = torch.empty(sum(m.out_features for m in linears), 1, dtype=w.dtype, device=w.device)
        weakref.finalize(self.key, _PACKED.pop, self.key.data_ptr(), None)
        has_bias = any(m.bias is not None for m in linears)
        self.bias = torch.zeros(self.key.shape[0], dtype=w.dtype, device=w.device) if has_bias else None
        self.refresh()

    def members(self) -> list[torch.Tensor]:
        return [t for m in self.linears for t in (m.weight, m.bias) if t is not None]

    @torch.no_grad()
    def refresh(self) -> None:
        weight = torch.cat([m.weight.detach() for m in self.linears])
        _PACKED[self.key.data_ptr()] = torch.ops.mkldnn._reorder_linear_weight(weight)
        if self.bias is not None:  # in place: compiled graphs read this tensor
            self.bias.copy_(torch.cat([m.bias if m.bias is not None else torch.zeros_like(m.weight[:, 0])
                                       for m in self.linears]))


def _packed(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The custom op where a graph is traced, the plain function eagerly (the op's Python costs)."""
    return (packed_linear if torch.compiler.is_compiling() else _packed_linear_fn)(x, weight, bias)


def _linear(module: torch.nn.Linear, x: torch.Tensor, packed: bool) -> torch.Tensor:
    """Through the packed copy on the packed path; a module put in a linear's place runs as it is."""
    return _packed(x, module.weight, module.bias) if packed and isinstance(module, torch.nn.Linear) else module(x)
