"""Model shapes: a model spec -> the architecture numbers that size it in memory.

Owns: ``Shape`` (layers, widths, heads, vocabulary, tied head, decoder or encoder) and its parameter
count (``params``: the count transformers builds for that config, checked in tests/test_placement.py),
the shapes of the models the presets and tests name (``KNOWN``: their published ``config.json`` values,
so a plan for Qwen2.5-7B is made on a machine that never downloaded it), ``shape_of(spec)`` (known,
else a local folder's ``config.json``) and ``hf_config`` (the transformers config of a shape, to build
a random-weight model of it: tests/gpu/device_check.py), and ``bucket`` (the token counts a CPU forward
is padded to, so that a server's kernels see a few dozen lengths: oneDNN caches a primitive per shape,
and the heap's free lists split on every new size; bench/bench_load.py measures the memory). Reads
JSON only; imports nothing heavy, so the GPU check can use it without the project's other dependencies.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from escrag.errors import UserError


def bucket(n: int) -> int:
    """``n`` tokens rounded up to the grid: a multiple of 8 below 128, then of an eighth of the power of
    two below ``n`` (at most 1/8 padding past 64 tokens; 8 lengths an octave)."""
    step = max(8, 1 << max(0, n.bit_length() - 4))
    return -(-n // step) * step


DECODERS = ("qwen2", "llama")  # causal LMs: q/k/v/o + SwiGLU MLP + RMSNorm (qwen2: q/k/v biases)
ENCODERS = ("xlm-roberta", "bert")  # sentence embedders: post-LN BERT layers, learned positions


@dataclass(frozen=True)
class Shape:
    arch: str  # transformers model_type
    hidden: int  # h
    layers: int  # L
    heads: int  # attention heads
    kv_heads: int  # key/value heads (grouped-query attention; = heads without it)
    intermediate: int  # I, the MLP width
    vocab: int  # V
    tied: bool = True  # the LM head shares the embedding matrix
    positions: int = 32768  # max_position_embeddings
    type_vocab: int = 0  # encoders: token-type embeddings

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        """Width of K (and of V) per token and layer: kv_heads x head_dim."""
        return self.kv_heads * self.head_dim

    @property
    def decoder(self) -> bool:
        return self.arch in DECODERS

    @property
    def params(self) -> int:
        """Parameter count of the model transformers builds for this config (the encoder without a pooler)."""
        h, i, v = self.hidden, self.intermediate, self.vocab
        if self.decoder:
            bias = h + 2 * self.kv_dim if self.arch == "qwen2" else 0
            layer = 2 * h * h + 2 * h * self.kv_dim + bias + 3 * h * i + 2 * h
            return v * h * (1 if self.tied else 2) + self.layers * layer + h
        layer = 4 * (h * h + h) + 2 * h * i + i + h + 4 * h  # attention, MLP, two LayerNorms
        return (v + self.positions + self.type_vocab) * h + 2 * h + self.layers * layer


KNOWN: dict[str, Shape] = {
    "Qwen/Qwen2.5-3B-Instruct": Shape("qwen2", 2048, 36, 16, 2, 11008, 151936, True, 32768),
    "Qwen/Qwen2.5-3B": Shape("qwen2", 2048, 36, 16, 2, 11008, 151936, True, 32768),
    "Qwen/Qwen2.5-7B-Instruct": Shape("qwen2", 3584, 28, 28, 4, 18944, 152064, False, 32768),
    "Qwen/Qwen2.5-7B": Shape("qwen2", 3584, 28, 28, 4, 18944, 152064, False, 131072),
    "BAAI/bge-m3": Shape("xlm-roberta", 1024, 24, 16, 16, 4096, 250002, True, 8194, 1),
    "packaged:smollm2-135m-instruct": Shape("llama", 576, 30, 9, 3, 1536, 49152, True, 8192),
    "packaged:minilm": Shape("bert", 384, 6, 12, 12, 1536, 30522, True, 512, 2),
    "tiny-random:qwen2": Shape("qwen2", 64, 2, 4, 2, 128, 49152, True, 4096),  # escrag.models._build_tiny
    "tiny-random:llama": Shape("llama", 64, 2, 4, 2, 128, 49152, True, 4096),
}


def from_config_json(path: Path) -> Shape:
    """The shape a transformers ``config.json`` describes (decoders and BERT-style encoders)."""
    c = json.loads(Path(path).read_text())
    arch = c.get("model_type")
    if arch not in DECODERS + ENCODERS:
        raise UserError(f"{path}: model_type {arch!r} is not one the placement plan can size "
                        f"({', '.join(DECODERS + ENCODERS)})")
    return Shape(arch, c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"],
                 c.get("num_key_value_heads", c["num_attention_heads"]), c["intermediate_size"], c["vocab_size"],
                 c.get("tie_word_embeddings", arch in ENCODERS), c.get("max_position_embeddings", 32768),
                 c.get("type_vocab_size", 0) if arch in ENCODERS else 0)


def shape_of(spec: str) -> Shape:
    """A model spec's shape: a known name, else the ``config.json`` of a local folder (for a
    sentence-transformers folder, the one at its top or in ``0_Transformer``)."""
    if spec in KNOWN:
        return KNOWN[spec]
    for name in ("config.json", "0_Transformer/config.json"):
        if (Path(spec) / name).is_file():
            return from_config_json(Path(spec) / name)
    raise UserError(f"{spec}: cannot size this model for the placement plan: not one of the known models "
                    f"({', '.join(KNOWN)}) and not a folder with a config.json")


def hf_config(shape: Shape, **extra):
    """The transformers config of ``shape`` (random weights: ``AutoModel.from_config``)."""
    from transformers import AutoConfig

    kwargs = dict(hidden_size=shape.hidden, num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
                  intermediate_size=shape.intermediate, vocab_size=shape.vocab, max_position_embeddings=shape.positions)
    if shape.decoder:
        kwargs.update(num_key_value_heads=shape.kv_heads, tie_word_embeddings=shape.tied)
    else:
        kwargs.update(type_vocab_size=shape.type_vocab)
    return AutoConfig.for_model(shape.arch, **{**kwargs, **extra})
