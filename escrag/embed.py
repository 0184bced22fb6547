"""Text embedders behind one small interface: ``load_embedder(spec) -> Embedder``.

Owns: loading a sentence-embedding model (on the CPU or a GPU) from a model spec (``packaged:minilm``,
the default, is all-MiniLM-L6-v2 from a PyPI package; any local folder or cached hub name such as
``BAAI/bge-m3`` works the same way) and encoding batches of texts into float32, L2-normalised rows,
so that inner product is cosine similarity. The retriever's index and the safety check share it,
which is why it lives in the core.

A sentence-transformers folder is read with transformers alone: its ``modules.json`` (a Transformer,
then a Pooling, then optionally Normalize), the pooling mode (mean or CLS) and the token limit; a
plain transformers folder is mean-pooled, as sentence-transformers does (other modules, or max
pooling, are an error). The rows equal sentence-transformers' to ~1e-7 (tests/test_embed.py).
Importing sentence-transformers cost every process that embeds ~3 s of CPU more (loading MiniLM and
embedding one text: 10.7 against 7.8 CPU-s on a 2-core AVX2 CPU), and every server, index build and
crisis check embeds.

Departure from the paper: the paper embeds with bge-m3; the embedded default uses all-MiniLM-L6-v2
(384-d, offline). Set ``retriever.embedder: BAAI/bge-m3`` where that model is in the HF cache.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from escrag.models import ModelSpecError, offline_env, resolve_device, resolve_model

STEPS = ("Transformer", "Pooling", "Normalize")


class Embedder:
    """A loaded encoder with its pooling (``mean`` or ``cls``); ``name`` is the spec it was loaded from."""

    def __init__(self, name: str, tokenizer, model, layout: dict):
        import torch

        self.name, self.tok, self.model, self._torch = name, tokenizer, model, torch
        self.pooling, self.dim = layout["pooling"], int(model.config.hidden_size)
        self.max_length = int(layout["max_length"] or min(tokenizer.model_max_length,
                                                          model.config.max_position_embeddings))

    def encode(self, texts: list[str], batch_size: int = 32, progress: bool = False) -> np.ndarray:
        """[len(texts), dim] float32 with unit-norm rows; texts go through in batches of similar length
        (32 by default: MiniLM over 1,200 of the safety cases on one AVX2 core, 29.7 s against 33.1 s
        in batches of 64)."""
        from escrag.progress import progress_bar

        out = np.zeros((len(texts), self.dim), np.float32)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        for start in progress_bar(range(0, len(order), batch_size), desc="embedding", unit="batch",
                                  disable=not progress):
            idx = order[start:start + batch_size]
            out[idx] = self._batch([texts[i] for i in idx])
        return out

    def _batch(self, texts: list[str]) -> np.ndarray:
        torch = self._torch
        enc = self.tok(texts, return_tensors="pt", padding=True, truncation=True, max_length=self.max_length)
        enc = enc.to(self.model.device)
        with torch.inference_mode():
            states = self.model(**enc).last_hidden_state
        if self.pooling == "cls":
            pooled = states[:, 0]
        else:
            mask = enc["attention_mask"].unsqueeze(-1).to(states.dtype)
            pooled = (states * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        return torch.nn.functional.normalize(pooled.float(), dim=-1).cpu().numpy()


def read_layout(path: Path, spec: str) -> dict:
    """model (the transformers folder: the top or, in older layouts, ``0_Transformer``), pooling and
    max_length (None: the model's) of a sentence-transformers folder (the layout of
    sentence-transformers 6 or of earlier releases, such as the packaged MiniLM's); mean pooling for a
    plain transformers folder."""
    modules = path / "modules.json"
    if not modules.is_file():
        return {"model": path, "pooling": "mean", "max_length": None}
    steps = json.loads(modules.read_text())
    kinds = [str(m.get("type")).rsplit(".", 1)[-1] for m in steps]
    if kinds not in (list(STEPS[:2]), list(STEPS)):
        raise ModelSpecError(f"{spec}: modules.json must be Transformer, Pooling[, Normalize]; got {kinds}")
    pool = json.loads((path / steps[1].get("path", "") / "config.json").read_text())
    modes = [pool["pooling_mode"]] if "pooling_mode" in pool else [
        k.removeprefix("pooling_mode_").removesuffix("_token").removesuffix("_tokens")
        for k, v in pool.items() if k.startswith("pooling_mode_") and v]
    if modes not in (["mean"], ["cls"]):
        raise ModelSpecError(f"{spec}: pooling must be mean or CLS alone; got {pool}")
    model = path / steps[0].get("path", "")
    config = model / "sentence_bert_config.json"
    st = json.loads(config.read_text()) if config.is_file() else {}
    return {"model": model, "pooling": modes[0], "max_length": st.get("max_seq_length")}


def load_embedder(spec: str, device: str = "cpu") -> Embedder:
    """Load the embedder named by a model spec on ``device`` (``auto``: the GPU when one is visible),
    without touching any model hub."""
    offline_env()
    path = resolve_model(spec)
    import torch
    from transformers import AutoModel, AutoTokenizer

    try:
        if not Path(path).is_dir():  # a hub name: its snapshot in the local cache
            from huggingface_hub import snapshot_download

            path = snapshot_download(path, local_files_only=True)
        layout = read_layout(Path(path), spec)
        tok = AutoTokenizer.from_pretrained(layout["model"])
        model = AutoModel.from_pretrained(layout["model"], dtype=torch.float32).eval().to(resolve_device(device))
    except ModelSpecError:
        raise
    except (OSError, ValueError, KeyError) as exc:
        raise ModelSpecError(f"{spec}: cannot load as a sentence embedder ({exc})") from None
    return Embedder(spec, tok, model, layout)
