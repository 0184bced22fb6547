"""The reward model R_φ(H, c) = g_ψ(f_θ(H, c)) of paper eq. 2: frozen backbone, linear head.

Owns: the model input (``escrag.prompts.rm_messages`` rendered by the backbone's chat template), the
left truncation that keeps it within ``max_length`` tokens, the frozen backbone's feature (the final
norm applied to the output of layer ``reward.layer``, default the last, read at the input's last token
or averaged over the reply's tokens: ``reward.pooling``), the linear head, and the head folder:
``head.safetensors`` (``weight`` [H], ``bias`` [1]) plus ``manifest.json`` naming the backbone, the
layer and the pooling.

Truncation: an input longer than ``max_length`` loses tokens from the left of the *history* only. The
RM system prompt and the candidate reply (the final assistant turn) are always kept whole; if they
alone exceed ``max_length``, the whole history is dropped and the input stays longer than
``max_length`` (the reply is never cut). Every truncated input is counted.

Batches: on a CPU every row runs alone, so a score is bitwise the same whatever else is in its batch. A
padded batch runs other kernels than a row alone (measured on SmolLM2, the same row alone vs in a batch
of 4: features differ by up to 8e-6 in float32 and 0.09 in bfloat16), and the server's micro-batcher
merges concurrent requests by arrival time, so a GRPO step's rewards would move with request timing. On a
CPU the rows of a ~160-token input are already a full GEMM each, and alone they run no padding: 16 rows
of 80-160 tokens, SmolLM2, 2 cores: float32 5.3 seq/s alone vs 4.8 batched, bfloat16 12.0 vs 12.1. On a
GPU, where batching pays, a batch is padded on the right and each row read at its own last real token
(positions start at 0 in every row): equal up to rounding.

Departures from the paper: the paper does not say which layer or token feeds the head; the default is
the last layer at the last token (``<|im_end|>`` of the reply under ChatML templates), and a middle layer
(the layers above it are then not loaded nor run) or the mean over the reply's tokens is a config choice
(experiments/reward_recipe/ chose the embedded default's). ``max_history_turns`` optionally keeps only
the last N turns before the token budget applies.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from escrag import atomic, prompts
from escrag.atomic import MANIFEST_FILE, atomic_file, write_json
from escrag.errors import UserError
from escrag.models import cpu_bf16_ready, resolve_device, resolve_model, torch_dtype

HEAD_FILE = "head.safetensors"
FORMAT_VERSION = 1
POOLINGS = ("last_token", "reply_mean")  # reward.pooling: the last token's state, or the mean over the reply's


@dataclass(frozen=True)
class Encoded:
    ids: list[int]  # backbone input ids, at most max_length unless the reply alone is longer
    truncated: bool  # history tokens were dropped to fit
    reply_len: int  # the last reply_len ids are the reply's turn (its role header, text and end token)


def backbone_fingerprint(spec: str, dtype: str) -> str:
    """Identity of a backbone for caches and manifests: the resolved folder's config and weight-file
    sizes (not a hash of the weights, which would cost a full read of a 7B model) plus the dtype."""
    path = resolve_model(spec)
    h = hashlib.sha256(f"{dtype}\n".encode())
    folder = Path(path)
    if folder.is_dir():
        cfg = folder / "config.json"
        h.update(cfg.read_bytes() if cfg.is_file() else b"")
        for f in sorted(folder.glob("*.safetensors")) + sorted(folder.glob("*.bin")):
            h.update(f"{f.name}:{f.stat().st_size}\n".encode())
    else:
        h.update(path.encode())  # a hub name: the name is all we know
    return h.hexdigest()[:16]


class Backbone:
    """The frozen f_θ with its tokenizer; ``features`` counts every sequence it runs."""

    def __init__(self, spec: str, dtype: str, max_length: int, max_turns: int | None = None, device: str = "cpu",
                 layer: int | None = None, pooling: str = "last_token"):
        """``dtype``, ``max_length``, ``layer``, ``pooling``: ``reward.*`` (or a head's manifest)."""
        import torch
        from transformers import AutoConfig, AutoModel, AutoTokenizer
        from transformers.utils import logging as hf_logging

        path = resolve_model(spec)
        depth = int(AutoConfig.from_pretrained(path).num_hidden_layers)
        if pooling not in POOLINGS or (layer is not None and not 1 <= layer <= depth):
            raise UserError(f"reward feature: layer {layer} (1-{depth} or None), pooling {pooling!r} "
                            f"({' or '.join(POOLINGS)})")
        self.spec, self.dtype, self.max_length, self.max_turns = spec, dtype, max_length, max_turns
        self.layer, self.pooling = layer, pooling
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.device = resolve_device(device)
        # reading layer L: the layers above it are never loaded nor run (num_hidden_layers = L); transformers
        # would list their weights as unexpected, a warning that is expected here
        quiet = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()
        try:
            model = AutoModel.from_pretrained(path, dtype=torch_dtype(dtype), num_hidden_layers=layer or depth)
        finally:
            hf_logging.set_verbosity(quiet)
        self.model = cpu_bf16_ready(model).to(self.device).eval()
        self.model.requires_grad_(False)
        self.hidden_size = int(self.model.config.hidden_size)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.fingerprint = backbone_fingerprint(spec, dtype)
        # the identity of a feature (caches): the backbone, and which layer and pooling are read
        self.feature_id = self.fingerprint + ("" if (layer, pooling) == (None, "last_token") else
                                              f"-L{layer or depth}-{pooling}")
        self.forward_passes = 0  # sequences run through the backbone so far
        self._torch = torch

    def _ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def encode(self, history: list[dict], response: str) -> Encoded:
        """(history, reply) -> input ids, truncating the history from the left (see module doc)."""
        msgs = prompts.rm_messages(history, response, self.max_turns)
        render = lambda m: prompts.render(self.tokenizer, m, add_generation_prompt=False)  # noqa: E731
        full, context, system = render(msgs).rstrip(), render(msgs[:-1]), render(msgs[:1])
        if not (full.startswith(context) and context.startswith(system)):  # an unusual chat template
            ids = self._ids(full)
            kept = ids[-self.max_length:]
            return Encoded(kept, len(ids) > self.max_length, min(len(kept), len(self._ids(response.strip())) + 1))
        sys_ids, hist_ids = self._ids(system), self._ids(context[len(system):])
        reply_ids = self._ids(full[len(context):])
        budget = self.max_length - len(sys_ids) - len(reply_ids)
        if len(hist_ids) <= budget:
            return Encoded(sys_ids + hist_ids + reply_ids, False, len(reply_ids))
        kept = hist_ids[len(hist_ids) - budget:] if budget > 0 else []
        return Encoded(sys_ids + kept + reply_ids, True, len(reply_ids))

    def features(self, encs: list[Encoded]):
        """Float32 tensor [B, H]: the final norm of layer ``layer``'s output, at the last token or averaged
        over the reply's tokens (``pooling``); each row alone on a CPU, else one padded batch (module doc)."""
        if self.device == "cpu" and len(encs) > 1:
            return self._torch.cat([self.features([e]) for e in encs])
        torch = self._torch
        lengths = torch.tensor([len(e.ids) for e in encs])
        width = int(lengths.max())
        ids = torch.full((len(encs), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(encs), width), dtype=torch.long)
        for i, e in enumerate(encs):
            ids[i, : len(e.ids)] = torch.tensor(e.ids)
            mask[i, : len(e.ids)] = 1
        with torch.inference_mode():
            hidden = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device)).last_hidden_state
        self.forward_passes += len(encs)
        if self.pooling == "last_token":
            return hidden[torch.arange(len(encs)), lengths - 1].float().cpu()
        return torch.stack([hidden[i, n - e.reply_len:n].float().mean(0) for i, (e, n) in
                            enumerate(zip(encs, lengths.tolist()))]).cpu()


# --------------------------------------------------------------------------- head folder


def save_head(out: str | Path, weight, bias: float, manifest: dict) -> Path:
    """Write head.safetensors then manifest.json (last, so a folder with a manifest is complete)."""
    import torch
    from safetensors.torch import save

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {"weight": torch.as_tensor(weight, dtype=torch.float32).reshape(-1).contiguous(),
               "bias": torch.tensor([float(bias)], dtype=torch.float32)}
    with atomic_file(out / HEAD_FILE, "wb") as fh:
        fh.write(save(tensors))
    manifest = {"format_version": FORMAT_VERSION, "hidden_size": int(tensors["weight"].numel()), **manifest}
    write_json(out / MANIFEST_FILE, manifest)
    return out


def read_manifest(head_dir: str | Path) -> dict:
    return atomic.read_manifest(head_dir, "a reward-model folder", "make one with `escrag rm train`",
                                ("backbone", "backbone_fingerprint", "dtype", "max_length", "hidden_size"))


def load_head(head_dir: str | Path):
    """(weight [H], bias float, manifest) from a head folder; clear errors for anything missing."""
    from safetensors.torch import load_file

    manifest = read_manifest(head_dir)
    path = Path(head_dir) / HEAD_FILE
    if not path.is_file():
        raise UserError(f"{head_dir}: {HEAD_FILE} is missing")
    tensors = load_file(str(path))
    weight, bias = tensors.get("weight"), tensors.get("bias")
    if weight is None or bias is None or weight.numel() != manifest["hidden_size"]:
        raise UserError(f"{path}: expected 'weight' [{manifest['hidden_size']}] and 'bias' [1]")
    return weight.float(), float(bias.reshape(-1)[0]), manifest


def check_backbone(manifest: dict, head_dir, backbone_spec: str | None) -> None:
    """Refuse a head trained on another backbone (or on a backbone folder that has changed since)."""
    spec = backbone_spec or manifest["backbone"]
    if backbone_spec and backbone_spec != manifest["backbone"]:
        if resolve_model(backbone_spec) != resolve_model(manifest["backbone"]):
            raise UserError(f"{head_dir}: the head was trained on backbone {manifest['backbone']!r}, "
                            f"not {backbone_spec!r}; a linear head only fits the backbone it was trained on")
    found = backbone_fingerprint(spec, manifest["dtype"])
    if found != manifest["backbone_fingerprint"]:
        raise UserError(f"{head_dir}: backbone {spec!r} ({manifest['dtype']}) has fingerprint {found}, but the "
                        f"head was trained on fingerprint {manifest['backbone_fingerprint']}; retrain the head")


class RewardModel:
    """A frozen backbone plus a trained head: ``score`` maps (history, reply) pairs to r_RM."""

    def __init__(self, backbone: Backbone, weight, bias: float, manifest: dict | None = None):
        self.backbone, self.weight, self.bias = backbone, weight, bias
        self.manifest = manifest or {}

    @classmethod
    def load(cls, head_dir: str | Path, backbone_spec: str | None = None, device: str = "cpu") -> RewardModel:
        weight, bias, manifest = load_head(head_dir)
        check_backbone(manifest, head_dir, backbone_spec)
        backbone = Backbone(backbone_spec or manifest["backbone"], manifest["dtype"], manifest["max_length"],
                            manifest.get("max_history_turns"), device, manifest.get("layer"),
                            manifest.get("pooling", "last_token"))
        if backbone.hidden_size != manifest["hidden_size"]:
            raise UserError(f"{head_dir}: head has {manifest['hidden_size']} inputs, backbone hidden size is "
                            f"{backbone.hidden_size}")
        return cls(backbone, weight, bias, manifest)

    def score(self, items: list[tuple[list[dict], str]]) -> tuple[list[float], list[bool]]:
        """One batch: rewards and, per item, whether its input was truncated."""
        enc = [self.backbone.encode(h, r) for h, r in items]
        feats = self.backbone.features(enc)
        scores = feats @ self.weight + self.bias
        return scores.tolist(), [e.truncated for e in enc]
