"""Text embedders behind one small interface: ``load_embedder(spec) -> Embedder``.

Owns: loading a sentence-transformers model (on the CPU or a GPU) from a model spec (``packaged:minilm``, the
default, is all-MiniLM-L6-v2 from a PyPI package; any local folder or cached hub name such as
``BAAI/bge-m3`` works the same way) and encoding batches of texts into float32, L2-normalised rows,
so that inner product is cosine similarity. The retriever's index and the safety check share it,
which is why it lives in the core.

Departure from the paper: the paper embeds with bge-m3; the embedded default uses all-MiniLM-L6-v2
(384-d, offline). Set ``retriever.embedder: BAAI/bge-m3`` where that model is in the HF cache.
"""

from __future__ import annotations

import numpy as np

from escrag.models import ModelSpecError, offline_env, resolve_device, resolve_model


class Embedder:
    """A loaded sentence-transformers model; ``name`` is the spec it was loaded from."""

    def __init__(self, name: str, model):
        self.name, self._model = name, model
        get_dim = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
        self.dim = int(get_dim())

    def encode(self, texts: list[str], batch_size: int = 64, progress: bool = False) -> np.ndarray:
        """[len(texts), dim] float32 with unit-norm rows."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        vecs = self._model.encode(list(texts), batch_size=batch_size, show_progress_bar=progress,
                                  convert_to_numpy=True, normalize_embeddings=True)
        return np.ascontiguousarray(vecs, dtype=np.float32)


def load_embedder(spec: str, device: str = "cpu") -> Embedder:
    """Load the embedder named by a model spec on ``device`` (``auto``: the GPU when one is visible),
    without touching any model hub."""
    offline_env()
    path = resolve_model(spec)
    from sentence_transformers import SentenceTransformer

    try:
        model = SentenceTransformer(path, device=resolve_device(device))
    except (OSError, ValueError) as exc:
        raise ModelSpecError(f"{spec}: cannot load as a sentence-transformers model ({exc})") from None
    return Embedder(spec, model)
