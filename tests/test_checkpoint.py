"""Checkpoints are data, never code: ``load_latest`` loads tensors and plain values only, and follows
``latest`` only to a ``step-*`` folder inside the checkpoint folder (issue 25, finding 10); a
checkpoint written now, and one written before (numpy arrays in its RNG file), still resume.

Run: .venv/bin/python -m pytest -q tests/test_checkpoint.py"""

import random

import numpy as np
import pytest
import torch

from trainer.checkpoint import CheckpointError, load_latest, save_checkpoint

pytestmark = pytest.mark.unit


def _learner_state():
    w = torch.nn.Parameter(torch.randn(3, 2))
    opt = torch.optim.AdamW([w], lr=1e-3)
    w.sum().backward()
    opt.step()
    return {"trainable": {"w": w.detach().clone()}, "optimizer": opt.state_dict(), "version": 4}


def test_a_checkpoint_round_trips_with_its_rng_states(tmp_path):
    learner = _learner_state()
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    save_checkpoint(tmp_path, 7, learner, {"sampler": {"epoch": 0}}, keep=2)
    expect = (random.random(), np.random.rand(), torch.rand(1).item())
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    loaded, state = load_latest(tmp_path)
    assert state["step"] == 7 and loaded["version"] == 4
    assert torch.equal(loaded["trainable"]["w"], learner["trainable"]["w"])
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expect


def test_a_checkpoint_written_before_still_loads(tmp_path):
    """Before this change rng.pt held numpy's state with its array."""
    folder = save_checkpoint(tmp_path, 3, _learner_state(), {}, keep=2)
    np.random.seed(5)
    old = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    torch.save(old, folder / "rng.pt")
    expect = np.random.rand()
    np.random.seed(0)
    assert load_latest(tmp_path)[1]["step"] == 3 and np.random.rand() == expect


class _Planted:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({str(self.marker)!r}, 'w').write('ran')",))


def test_a_planted_pickle_is_refused_before_it_runs(tmp_path):
    folder = save_checkpoint(tmp_path, 1, _learner_state(), {}, keep=2)
    marker = tmp_path / "code-ran"
    torch.save({"trainable": {}, "payload": _Planted(marker)}, folder / "learner.pt")
    with pytest.raises(CheckpointError, match="refused"):
        load_latest(tmp_path)
    assert not marker.exists()


@pytest.mark.parametrize("pointer", ["../elsewhere/step-000001", "ABSOLUTE", "step-000001/..", "notes.txt"])
def test_latest_must_name_a_checkpoint_folder_inside(tmp_path, pointer):
    root, other = tmp_path / "run", tmp_path / "elsewhere"
    save_checkpoint(other, 1, _learner_state(), {}, keep=2)  # a valid checkpoint outside the run folder
    save_checkpoint(root, 1, _learner_state(), {}, keep=2)
    (root / "notes.txt").write_text("x")
    target = str(other / "step-000001") if pointer == "ABSOLUTE" else pointer
    (root / "latest").write_text(target + "\n")
    with pytest.raises(CheckpointError, match="not a checkpoint folder"):
        load_latest(root)
