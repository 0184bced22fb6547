"""escrag/embed.py reads sentence-transformers folders with transformers alone: its rows equal
sentence-transformers' own (the reference, a dev dependency only) for the packaged all-MiniLM-L6-v2
(mean pooling, 256 tokens, the layout of sentence-transformers 2) and for a tiny random BERT saved by
sentence-transformers 6 with CLS pooling and 16 tokens; a folder it cannot reproduce is a clear error
that names what is wrong, not different vectors.
Run: .venv/bin/python -m pytest -q tests/test_embed.py"""

import json

import numpy as np
import pytest

from escrag.embed import load_embedder
from escrag.models import ModelSpecError, resolve_model

TEXTS = ["I have the pills counted out for tonight.", "", "The boiler is BROKEN again!",
         "My exam is killing me " * 90,  # past 256 tokens: truncated alike
         "ok", "We argued about money and now she won't talk to me, I feel so alone."]


def _reference(folder: str) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(folder, device="cpu")
    return st.encode(TEXTS, batch_size=4, convert_to_numpy=True, normalize_embeddings=True)


def test_packaged_minilm_rows_equal_sentence_transformers():
    ours = load_embedder("packaged:minilm")
    got = ours.encode(TEXTS, batch_size=4)
    assert got.shape == (len(TEXTS), 384) and got.dtype == np.float32
    np.testing.assert_allclose(got, _reference(resolve_model("packaged:minilm")), atol=2e-6)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-6)
    np.testing.assert_allclose(ours.encode(TEXTS[2:3]), got[2:3], atol=2e-6)  # a row does not depend on its batch
    assert ours.encode([]).shape == (0, 384)


@pytest.fixture(scope="module")
def tiny_cls(tmp_path_factory):
    """A random 2-layer BERT with MiniLM's tokenizer, saved by sentence-transformers with CLS pooling."""
    import torch
    from sentence_transformers import SentenceTransformer, models
    from transformers import AutoTokenizer, BertConfig, BertModel

    torch.manual_seed(0)
    base = tmp_path_factory.mktemp("tiny-bert")
    tok = AutoTokenizer.from_pretrained(resolve_model("packaged:minilm"))
    BertModel(BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=37)).save_pretrained(base)
    tok.save_pretrained(base)
    word = models.Transformer(str(base), max_seq_length=16)
    folder = tmp_path_factory.mktemp("tiny-st")
    SentenceTransformer(modules=[word, models.Pooling(32, pooling_mode="cls"), models.Normalize()]).save(str(folder))
    return folder


def test_cls_pooling_and_max_length_follow_the_folder(tiny_cls):
    ours = load_embedder(str(tiny_cls))
    assert (ours.pooling, ours.max_length) == ("cls", 16)
    want = _reference(str(tiny_cls))
    np.testing.assert_allclose(ours.encode(TEXTS, batch_size=4), want, atol=2e-6)
    ours.pooling = "mean"  # the reference is not mean-pooled: the folder's pooling is what makes them equal
    assert not np.allclose(ours.encode(TEXTS), want, atol=1e-3)


def test_a_folder_it_cannot_reproduce_is_an_error(tiny_cls, tmp_path):
    import shutil

    for name, edit, match in [
        ("dense", lambda m, p: m.append({"idx": 3, "name": "3", "path": "3_Dense",
                                         "type": "sentence_transformers.models.Dense"}), "Transformer, Pooling"),
        ("max", lambda m, p: p.update(pooling_mode="max"), "mean or CLS"),
    ]:
        folder = tmp_path / name
        shutil.copytree(tiny_cls, folder)
        modules = json.loads((folder / "modules.json").read_text())
        pool_cfg = folder / modules[1]["path"] / "config.json"
        pool = json.loads(pool_cfg.read_text())
        edit(modules, pool)
        (folder / "modules.json").write_text(json.dumps(modules))
        pool_cfg.write_text(json.dumps(pool))
        with pytest.raises(ModelSpecError, match=match) as err:
            load_embedder(str(folder))
        assert "cannot load" not in str(err.value)  # the layout's own message, not wrapped
    with pytest.raises(ModelSpecError, match="cannot load"):
        load_embedder(str(tmp_path / "max" / "1_Pooling"))  # a folder with no model in it
