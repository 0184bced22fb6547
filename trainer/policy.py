"""The trainable policy: a causal LM, optionally wrapped with LoRA (peft), and its merged export.

Owns: building the policy from ``PolicyConfig`` (SFT and the GRPO learner share it), its precision
(``compute``), gradient checkpointing (``set_checkpointing``, ``eval_mode``), the merged base-model weights under LoRA (W + scale·B·A, with the base model's HF
parameter names), and saving a plain model folder that ``escrag.models.load_causal_lm`` loads, so
every other part of the project only ever sees a path. Saving is atomic (``escrag.atomic.atomic_dir``).

Precision. Trainable weights are always float32 (master weights): with weights near 0.02 and a step
of lr 1e-6, an Adam update is far below bfloat16's resolution (8 bits of mantissa) and would round
away. ``policy.dtype`` is the compute dtype: bfloat16 or float16 run the forward passes under
``torch.autocast`` (CPU and GPU alike). Under LoRA the frozen base Linears are stored in that dtype
(``store_frozen_linears``: the operands autocast would have made anyway); the full fine-tune keeps
every weight in float32. The LoRA merge is done in float32, and weights are cast to the engines' dtype
once, when exported; a saved model folder is float32.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import torch

from escrag.atomic import atomic_dir
from escrag.config import PolicyConfig
from escrag.models import cache_kwarg, load_causal_lm, load_tokenizer, resolve_device, torch_dtype
from escrag.sampling import token_logprobs

PEFT_PREFIX = "base_model.model."


def build_policy(cfg: PolicyConfig, model: str | None = None):
    """(model, tokenizer) for ``model`` (default ``cfg.model``): float32 weights on ``cfg.device``;
    with LoRA, a peft model whose base weights are frozen. Returns the model in train mode."""
    spec = model or cfg.model
    tok = load_tokenizer(spec)
    lm = load_causal_lm(spec, "float32").to(resolve_device(cfg.device))
    if cfg.gradient_checkpointing:
        set_checkpointing(lm, True)
    if cfg.lora.enabled:
        from peft import LoraConfig, get_peft_model

        lc = cfg.lora
        peft_cfg = LoraConfig(r=lc.r, lora_alpha=lc.alpha, lora_dropout=lc.dropout,
                              target_modules=list(lc.target_modules), task_type="CAUSAL_LM")
        lm = get_peft_model(lm, peft_cfg)
        if cfg.compute_dtype != "float32":
            store_frozen_linears(lm, torch_dtype(cfg.compute_dtype))
    lm.train()
    return lm, tok


def store_frozen_linears(model, dtype) -> None:
    """Under LoRA with a lower compute dtype: every frozen ``nn.Linear`` of the base model stored in
    that dtype. Autocast would cast each of them to it on every call (it caches casts of trainable
    weights only), so the forward sees the same operands, without the copies and at half the memory
    traffic. The LM head is left alone (tied to the input embeddings in SmolLM2; the embeddings and
    norms stay float32, so the residual stream does too). The LoRA merge adds ΔW in float32 to these
    weights: a saved model carries them at the precision the policy computed with."""
    head = model.get_base_model().get_output_embeddings()
    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and module is not head and not module.weight.requires_grad:
            module.to(dtype)


def set_checkpointing(model, on: bool) -> None:
    """Gradient checkpointing per decoder layer (``policy.gradient_checkpointing``) on or off: the
    layer's activations are recomputed in the backward pass instead of kept. Non-reentrant
    (``use_reentrant=False``), so the inputs need no gradient and LoRA works without
    ``enable_input_require_grads``. (``activation_checkpointing_enable`` is transformers >= 5.2x's name;
    the GPU check's 5.17 has only ``gradient_checkpointing_enable``.)"""
    if not on:
        off = getattr(model, "activation_checkpointing_disable", None) or model.gradient_checkpointing_disable
        off()
    elif hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def eval_mode(model):
    """Eval mode (dropout off: the ratio compares like with like) that keeps gradient checkpointing:
    transformers recomputes a layer only when the layer is in training mode, so the checkpointed
    layers themselves are flagged as training, never their submodules (dropout stays off)."""
    model.eval()
    for module in model.modules():
        if getattr(module, "gradient_checkpointing", False) is True:
            module.training = True
    return model


def compute(cfg: PolicyConfig, model):
    """The context forward passes run in: autocast to ``cfg.compute_dtype`` unless it is float32."""
    if cfg.compute_dtype == "float32":
        return contextlib.nullcontext()
    device = next(model.parameters()).device.type
    return torch.autocast(device_type=device, dtype=torch_dtype(cfg.compute_dtype))


def is_lora(model) -> bool:
    return hasattr(model, "peft_config")


def _lora_layers(model):
    """(base-model name, LoraLayer) for every LoRA-wrapped module."""
    from peft.tuners.lora import LoraLayer

    for name, module in model.named_modules():
        if isinstance(module, LoraLayer):
            yield name.removeprefix(PEFT_PREFIX), module


@torch.no_grad()
def lora_merged_weights(model) -> dict[str, torch.Tensor]:
    """Under LoRA: ``{"<module>.weight": W + ΔW}`` for the LoRA target modules only (HF base names),
    summed in float32 whatever the base dtype, so a small ΔW is not rounded away."""
    out = {}
    for name, layer in _lora_layers(model):
        weight = layer.get_base_layer().weight.detach().float().clone()
        for adapter in layer.active_adapters:
            if adapter in layer.lora_A:
                weight += layer.get_delta_weight(adapter).float()
        out[f"{name}.weight"] = weight
    return out


@torch.no_grad()
def merged_state_dict(model) -> dict[str, torch.Tensor]:
    """Every parameter of the base model with HF names; LoRA deltas merged in."""
    if not is_lora(model):
        return {n: p.detach() for n, p in model.named_parameters()}
    merged = lora_merged_weights(model)
    out = {}
    for name, p in model.get_base_model().named_parameters():
        if "lora_" in name:
            continue
        name = name.replace(".base_layer.", ".")
        out[name] = merged.get(name, p.detach())
    return out


def base_config(model):
    return model.get_base_model().config if is_lora(model) else model.config


def save_merged(model, tokenizer, out: str | Path, meta: dict | None = None) -> Path:
    """Write a plain HF model folder (safetensors, config, tokenizer) atomically; returns ``out``."""
    from safetensors.torch import save_file

    out = Path(out)
    with atomic_dir(out) as tmp:
        state = {k: v.float().contiguous().cpu() for k, v in merged_state_dict(model).items()}
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        config = base_config(model)
        config.save_pretrained(tmp)
        gen = getattr(model, "generation_config", None)
        if gen is not None:
            gen.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "escrag_meta.json").write_text(json.dumps(meta or {}, indent=2) + "\n")
    return out


def left_pad(seqs: list[list[int]], pad_id: int):
    """Left-pad token lists -> (input_ids, attention_mask, position_ids), each [B, T]. Positions
    count real tokens only, so a sequence scores the same whatever the padding around it."""
    T = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), T), pad_id, dtype=torch.long)
    attn = torch.zeros((len(seqs), T), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, T - len(s):] = torch.tensor(s, dtype=torch.long)
        attn[i, T - len(s):] = 1
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    return ids, attn, pos


def _decoder_and_head(model):
    """(the decoder stack, the LM head) of a causal LM, LoRA-wrapped or not (peft injects its layers
    into the base model's modules, so ``disable_adapter`` still switches them off)."""
    lm = model.get_base_model() if is_lora(model) else model
    return lm.get_decoder(), lm.get_output_embeddings()


def _scored(head, hidden, targets, where, shape, temperature: float) -> torch.Tensor:
    """The LM head and log-softmax on the scored positions only (``hidden`` [N, H] predicting
    ``targets`` [N]), placed at ``where`` (row, column index tensors) of a zero [B, keep] tensor."""
    lp = token_logprobs(head(hidden), targets, temperature)
    return lp.new_zeros(shape).index_put(where, lp)


def tail_logprobs(model, seqs: list[list[int]], mask: torch.Tensor, pad_id: int,
                  temperature: float = 1.0) -> torch.Tensor:
    """log π(x_t | x_<t) for the last ``keep = mask.shape[1]`` tokens of every sequence where ``mask``
    [B, keep] is 1, 0 elsewhere: [B, keep] (float32), from the logits divided by ``temperature``
    (``escrag.sampling.token_logprobs``: the quantity the engines record at that sampling temperature;
    SFT's likelihood uses 1).

    Sequences are left-padded so their ends line up. The LM head and the log-softmax run on the scored
    positions only: on a 49k vocabulary they dominate the cost of a small model otherwise, and a
    two-stage rollout's masked feedback turn (120 of its 312 tail tokens in the demo) needs neither.
    """
    device = next(model.parameters()).device
    ids, attn, pos = (t.to(device) for t in left_pad(seqs, pad_id))
    T, keep = ids.shape[1], mask.shape[1]
    if keep >= T:
        raise ValueError(f"tail_logprobs: {keep} tail tokens asked of sequences of at most {T}")
    decoder, head = _decoder_and_head(model)
    hidden = decoder(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False).last_hidden_state
    where = mask.to(device).nonzero(as_tuple=True)  # column c is token T - keep + c, predicted by position c - 1 of it
    return _scored(head, hidden[:, T - keep - 1:T - 1][where], ids[:, T - keep:][where], where, mask.shape,
                   temperature)


def shared_prefix(seqs: list[list[int]], first_trained: list[int]) -> int:
    """Tokens every sequence starts with, up to the one before the earliest trained token (whose
    position predicts it): what ``tail_logprobs`` may run once for a group. 0 when one sequence only."""
    if len(seqs) < 2:
        return 0
    limit = min(min(first_trained) - 1, *(len(s) for s in seqs))
    head = seqs[0]
    for i in range(max(limit, 0)):
        if any(s[i] != head[i] for s in seqs[1:]):
            return i
    return max(limit, 0)


def prefix_tail_logprobs(model, seqs: list[list[int]], mask: torch.Tensor, shared: int, pad_id: int,
                         temperature: float = 1.0) -> torch.Tensor:
    """``tail_logprobs`` for sequences that share their first ``shared`` tokens (a GRPO group's prompt):
    the prefix runs once (batch 1, with gradient), its KV cache is repeated over the batch and the
    right-padded suffixes run on it. Same [B, keep] layout; every scored token must lie after the
    prefix (``shared_prefix`` stops before the first trained token). Not with gradient checkpointing
    (a recomputed layer would append to the cache twice)."""
    device = next(model.parameters()).device
    decoder, head = _decoder_and_head(model)
    kw = cache_kwarg(decoder)
    cache = getattr(decoder(input_ids=torch.tensor([seqs[0][:shared]], device=device), use_cache=True), kw)
    cache.batch_repeat_interleave(len(seqs))
    rests = [s[shared:] for s in seqs]
    S = max(len(r) for r in rests)
    ids = torch.full((len(seqs), S), pad_id, dtype=torch.long)
    attn = torch.zeros((len(seqs), shared + S), dtype=torch.long)
    attn[:, :shared] = 1
    for i, r in enumerate(rests):
        ids[i, :len(r)] = torch.tensor(r, dtype=torch.long)
        attn[i, shared:shared + len(r)] = 1
    pos = torch.arange(shared, shared + S).expand(len(seqs), S)
    hidden = decoder(input_ids=ids.to(device), attention_mask=attn.to(device), position_ids=pos.to(device),
                     use_cache=True, **{kw: cache}).last_hidden_state
    rows, cols = mask.cpu().nonzero(as_tuple=True)
    keep, lengths = mask.shape[1], torch.tensor([len(s) for s in seqs])
    at = lengths[rows] - keep + cols - shared  # the scored token's index in its suffix
    if at.numel() and int(at.min()) < 1:
        raise ValueError("prefix_tail_logprobs: a scored token lies inside the shared prefix")
    rows, at, where = rows.to(device), at.to(device), (rows.to(device), cols.to(device))
    return _scored(head, hidden[rows, at - 1], ids.to(device)[rows, at], where, mask.shape, temperature)
