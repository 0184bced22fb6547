"""Reward model pieces on the tiny random Qwen2: RM inputs are truncated from the left of the history
only (the reply is never cut) and flagged, and know where the reply starts; ``reward.layer`` /
``reward.pooling`` read the layer and tokens they name; a score is bitwise the same in any batch, for
every pooling; the feature cache runs the backbone once per input and is keyed by backbone and feature; a
head folder round-trips (its layer and pooling too) and refuses another backbone or a changed one.
Run: .venv/bin/python -m pytest -q tests/test_reward_model.py"""

import json
import re

import numpy as np
import pytest
import torch

from escrag.config import RewardConfig
from escrag.errors import UserError
from reward_server.features import FeatureCache, cached_features
from reward_server.model import Backbone, RewardModel, check_backbone, load_head, read_manifest, save_head

REPLY = "It sounds like you have been carrying a lot on your own lately. What has been the hardest part?"


def _history(turns: int) -> list[dict]:
    msgs = []
    for i in range(turns):
        msgs.append({"role": "user", "content": f"client turn {i}: " + "I feel lost and tired " * 4})
        msgs.append({"role": "assistant", "content": f"counselor turn {i}: tell me more."})
    return msgs[:-1]  # ends with the client


@pytest.fixture(scope="module")
def backbone():
    return Backbone("tiny-random:qwen2", "float32", max_length=96)


def test_short_input_is_whole_and_untruncated(backbone):
    enc = backbone.encode(_history(1), REPLY)
    text = backbone.tokenizer.decode(enc.ids)
    assert not enc.truncated and len(enc.ids) <= 96
    assert "client turn 0" in text and text.rstrip().endswith(REPLY + "<|im_end|>")
    assert text.startswith("<|im_start|>system\nJudge")


def test_long_history_loses_its_left_end_never_the_reply(backbone):
    enc = backbone.encode(_history(8), REPLY)
    text = backbone.tokenizer.decode(enc.ids)
    assert enc.truncated and len(enc.ids) == 96
    assert text.startswith("<|im_start|>system\nJudge")  # the RM instruction is kept
    assert "client turn 0" not in text and "client turn 7" in text
    assert text.rstrip().endswith(REPLY + "<|im_end|>")


def test_reply_longer_than_window_is_kept_whole(backbone):
    long_reply = " ".join(f"word{i}" for i in range(120))
    enc = backbone.encode(_history(3), long_reply)
    text = backbone.tokenizer.decode(enc.ids)
    assert enc.truncated and len(enc.ids) > 96
    assert long_reply in text and "client turn" not in text


@pytest.mark.parametrize("dtype,layer,pooling", [("float32", None, "last_token"), ("bfloat16", None, "last_token"),
                                                 ("float32", 1, "reply_mean"), ("bfloat16", 1, "reply_mean")])
def test_features_do_not_depend_on_the_batch(dtype, layer, pooling):
    """On a CPU a row's feature is bitwise the same alone and in any batch (each row runs alone: a padded
    batch would run other kernels, and a score would move with the batch and with it a GRPO step with
    the timing of the requests the reward server merges)."""
    backbone = Backbone("tiny-random:qwen2", dtype, max_length=96, layer=layer, pooling=pooling)
    seqs = [backbone.encode(_history(k), r) for k in (1, 2, 8) for r in (REPLY, "ok then")]
    batch = backbone.features(seqs)
    assert batch.shape == (6, backbone.hidden_size) and batch.dtype == torch.float32
    for i, s in enumerate(seqs):
        assert torch.equal(backbone.features([s])[0], batch[i]), i
    assert torch.equal(backbone.features(seqs[::-1]), batch.flip(0))
    assert not torch.allclose(batch[0], batch[1])


def test_reply_tokens_are_the_final_assistant_turn(backbone):
    for turns, reply in ((1, REPLY), (8, REPLY), (3, " ".join(f"word{i}" for i in range(120)))):
        enc = backbone.encode(_history(turns), reply)
        text = backbone.tokenizer.decode(enc.ids[-enc.reply_len:])
        assert text.startswith("<|im_start|>assistant") and text.rstrip().endswith(reply + "<|im_end|>")
        assert "client turn" not in text


def test_layer_and_pooling_read_what_they_say(backbone):
    """``layer`` L: the final norm of decoder layer L's output (the layers above are not loaded);
    ``reply_mean``: its mean over the reply's tokens. Each option changes the feature."""
    enc = backbone.encode(_history(2), REPLY)
    with torch.inference_mode():
        out = backbone.model(input_ids=torch.tensor([enc.ids]), output_hidden_states=True)
        # hidden_states[L]: decoder layer L's output; the last one has the final norm applied already
        normed = [backbone.model.norm(h[0]) for h in out.hidden_states[:-1]] + [out.last_hidden_state[0]]
    assert torch.equal(backbone.features([enc])[0], out.last_hidden_state[0, -1])
    first = Backbone("tiny-random:qwen2", "float32", max_length=96, layer=1)
    mean = Backbone("tiny-random:qwen2", "float32", max_length=96, pooling="reply_mean")
    both = Backbone("tiny-random:qwen2", "float32", max_length=96, layer=1, pooling="reply_mean")
    assert len(first.model.layers) == 1 and len(backbone.model.layers) == 2
    torch.testing.assert_close(first.features([enc])[0], normed[1][-1])
    torch.testing.assert_close(mean.features([enc])[0], normed[2][-enc.reply_len:].mean(0))
    torch.testing.assert_close(both.features([enc])[0], normed[1][-enc.reply_len:].mean(0))
    feats = [b.features([enc])[0] for b in (backbone, first, mean, both)]
    assert all(not torch.allclose(a, b) for i, a in enumerate(feats) for b in feats[i + 1:])
    ids = {b.feature_id for b in (backbone, first, mean, both)}
    assert len(ids) == 4 and backbone.feature_id == backbone.fingerprint  # caches of today's feature stay valid
    for bad in ({"layer": 3}, {"layer": 0}, {"pooling": "first_token"}):
        with pytest.raises(UserError, match="reward feature"):
            Backbone("tiny-random:qwen2", "float32", max_length=96, **bad)


def test_feature_cache_computes_once_and_is_keyed_by_backbone(backbone, tmp_path):
    seqs = [backbone.encode(_history(k), r) for k in (1, 2) for r in (REPLY, "ok then")]
    cache = FeatureCache(tmp_path, backbone.fingerprint, backbone.hidden_size)
    before = backbone.forward_passes
    first, stats = cached_features(backbone, seqs + seqs[:1], cache, batch_size=3)
    assert stats == {"cached": 1, "computed": 4} and backbone.forward_passes - before == 4
    again, stats = cached_features(backbone, seqs, FeatureCache(tmp_path, backbone.fingerprint, backbone.hidden_size),
                                   RewardConfig().feature_batch_size)
    assert stats == {"cached": 4, "computed": 0} and backbone.forward_passes - before == 4
    np.testing.assert_array_equal(first[:4], again)
    np.testing.assert_allclose(first[0], backbone.features([seqs[0]])[0].numpy(), atol=1e-5)
    other = FeatureCache(tmp_path, "another-backbone", backbone.hidden_size)
    assert other.get([other.key(s.ids) for s in seqs]) == {} and other.key(seqs[0].ids) != cache.key(seqs[0].ids)


def _manifest(bb):
    return {"backbone": bb.spec, "backbone_fingerprint": bb.fingerprint, "dtype": bb.dtype,
            "max_length": bb.max_length, "max_history_turns": None}


def test_head_round_trip_and_scores(backbone, tmp_path):
    weight = torch.linspace(-1, 1, backbone.hidden_size)
    save_head(tmp_path / "rm", weight, 0.25, _manifest(backbone))
    w, b, manifest = load_head(tmp_path / "rm")
    assert torch.equal(w, weight) and b == 0.25 and manifest["hidden_size"] == backbone.hidden_size
    rm = RewardModel.load(tmp_path / "rm")
    items = [(_history(1), REPLY), (_history(8), "ok")]
    scores, truncated = rm.score(items)
    feats = backbone.features([backbone.encode(h, r) for h, r in items])
    assert scores == pytest.approx((feats @ weight + 0.25).tolist(), abs=1e-4)
    assert truncated == [False, True]


def test_the_label_checks_score_in_batches_with_a_progress_line(backbone, tmp_path, capsys):
    """``evaluation.labels.rm_scorer`` (``escrag eval labels --rm``): the head's scores, batch by batch, and a
    progress line on a log (minutes of silence on a CPU otherwise)."""
    from evaluation.labels import rm_scorer

    save_head(tmp_path / "rm", torch.linspace(-1, 1, backbone.hidden_size), 0.1, _manifest(backbone))
    items = [(_history(k % 3 + 1), REPLY if k % 2 else "ok") for k in range(5)]
    got = rm_scorer(str(tmp_path / "rm"), batch=2)(items)
    assert got == pytest.approx(RewardModel.load(tmp_path / "rm").score(items)[0], abs=1e-6)
    assert f"scoring with {tmp_path / 'rm'}: 5/5 (100%)" in capsys.readouterr().err


def test_head_reads_the_layer_and_pooling_of_its_manifest(backbone, tmp_path):
    weight = torch.linspace(-1, 1, backbone.hidden_size)
    save_head(tmp_path / "rm", weight, 0.0, {**_manifest(backbone), "layer": 1, "pooling": "reply_mean"})
    rm = RewardModel.load(tmp_path / "rm")
    items = [(_history(1), REPLY), (_history(3), "ok")]
    both = Backbone("tiny-random:qwen2", "float32", max_length=96, layer=1, pooling="reply_mean")
    want = both.features([both.encode(h, r) for h, r in items]) @ weight
    assert rm.score(items)[0] == pytest.approx(want.tolist(), abs=1e-5)
    today = backbone.features([backbone.encode(h, r) for h, r in items]) @ weight
    assert rm.score(items)[0] != pytest.approx(today.tolist(), abs=1e-3)


def test_head_refuses_another_or_changed_backbone(backbone, tmp_path):
    save_head(tmp_path / "rm", torch.zeros(backbone.hidden_size), 0.0, _manifest(backbone))
    manifest = read_manifest(tmp_path / "rm")
    with pytest.raises(UserError, match="trained on backbone 'tiny-random:qwen2', not 'tiny-random:llama'"):
        check_backbone(manifest, tmp_path / "rm", "tiny-random:llama")
    check_backbone(manifest, tmp_path / "rm", "tiny-random:qwen2")  # same backbone: fine
    manifest["backbone_fingerprint"] = "0" * 16
    (tmp_path / "rm" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(UserError, match="retrain the head"):
        RewardModel.load(tmp_path / "rm")


def test_bad_head_folders_fail_clearly(backbone, tmp_path):
    with pytest.raises(UserError, match="not a reward-model folder"):
        load_head(tmp_path)
    save_head(tmp_path / "rm", torch.zeros(backbone.hidden_size), 0.0, _manifest(backbone))
    (tmp_path / "rm" / "head.safetensors").unlink()
    with pytest.raises(UserError, match="head.safetensors is missing"):
        load_head(tmp_path / "rm")
    (tmp_path / "rm" / "manifest.json").write_text("{")
    with pytest.raises(UserError, match="invalid JSON"):
        load_head(tmp_path / "rm")


def test_bad_manifest_names_the_folder_or_file(tmp_path):
    missing = f"{tmp_path}: not a reward-model folder (no manifest.json; make one with `escrag rm train`)"
    with pytest.raises(UserError, match="^" + re.escape(missing)):
        read_manifest(tmp_path)
    path = tmp_path / "manifest.json"
    for text, why in (("{", "invalid JSON"), ('"x"', "not a JSON object"),
                      ('{"backbone": "b", "dtype": "float32"}', "missing field(s) backbone_fingerprint, max_length, hidden_size")):
        path.write_text(text)
        with pytest.raises(UserError, match=re.escape(f"{path}: {why}")):
            read_manifest(tmp_path)
