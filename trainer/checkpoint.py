"""Training state that survives a crash: atomic checkpoints.

Owns: ``save_checkpoint`` / ``load_latest`` (the sampler, ``trainer.sampler.StateSampler``, saves its
position in ``state.json``). A checkpoint folder ``checkpoints/step-NNNNNN/`` holds the
learner state (trainable parameters, i.e. the LoRA adapter or the full policy, the optimizer, the
weights version), ``state.json`` (completed steps, sampler position) and ``rng.pt`` (Python, NumPy
and torch RNG states of the driver). It is written to a temp folder and renamed into place, then the
``latest`` file is replaced atomically, so a kill at any moment leaves the previous checkpoint usable.

A resumed run continues at exactly the same step and data position. Group seeds are derived from
(run seed, step, state), so at ``grpo.max_staleness`` 0 it draws exactly the samples of an
uninterrupted run; at k > 0 the rollout batches that were in flight are not saved and are drawn again
with the checkpoint's weights (``ray_jobs/train_grpo.py``).

A checkpoint is data: it loads with ``torch.load(weights_only=True)`` (tensors and plain values; numpy
arrays for the RNG files of older checkpoints), and ``latest`` must name a ``step-*`` folder inside the
checkpoint folder, so a planted file cannot run code or send the job to another folder.
"""

from __future__ import annotations

import json
import pickle
import random
import re
import shutil
from pathlib import Path

import numpy as np
import torch

from escrag.atomic import atomic_dir, write_text
from escrag.errors import UserError

try:  # numpy 2; numpy 1 keeps it in numpy.core
    from numpy._core.multiarray import _reconstruct as _np_reconstruct
except ImportError:  # pragma: no cover
    from numpy.core.multiarray import _reconstruct as _np_reconstruct

_STEP = re.compile(r"step-\d{6,}")


class CheckpointError(UserError):
    """A checkpoint that will not be loaded: an unsafe file, or a ``latest`` pointing outside."""


def _rng_state() -> dict:
    """The driver's RNG states in plain types and tensors (loadable with ``weights_only=True``)."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {"python": random.getstate(), "numpy": (name, keys.tolist(), pos, has_gauss, cached),
            "torch": torch.get_rng_state()}


def _set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def save_checkpoint(root: str | Path, step: int, learner_state: dict, state: dict, keep: int) -> Path:
    """Write ``root/step-NNNNNN`` atomically, point ``root/latest`` at it, keep the newest ``keep``
    (``grpo.keep_checkpoints``)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:06d}"
    with atomic_dir(final) as tmp:
        torch.save(learner_state, tmp / "learner.pt")
        torch.save(_rng_state(), tmp / "rng.pt")
        (tmp / "state.json").write_text(json.dumps({"step": step, **state}, indent=2) + "\n")
    write_text(root / "latest", final.name + "\n")
    for old in sorted(root.glob("step-*"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _safe_load(path: Path):
    """``torch.load`` of tensors and plain types only (``weights_only``); numpy arrays are allowed too,
    for the RNG files that checkpoints written before this rule hold. Anything else is refused
    before it can run: a checkpoint is data, never code."""
    with torch.serialization.safe_globals([np.ndarray, np.dtype, np.dtypes.UInt32DType, _np_reconstruct]):
        try:
            return torch.load(path, weights_only=True)
        except pickle.UnpicklingError as exc:
            why = next((ln for ln in str(exc).splitlines() if "got <" in ln or "Unsupported" in ln), "")
            raise CheckpointError(f"{path}: refused: it holds more than tensors and plain values {why[:200]}"
                                  ) from None


def checkpoint_folder(root: Path) -> Path | None:
    """The folder ``root/latest`` names (None without a pointer); it must be a ``step-*`` folder
    directly inside ``root``, never a path elsewhere (absolute, ``../``)."""
    pointer = root / "latest"
    if not pointer.is_file():
        return None
    name = pointer.read_text().strip()
    folder = (root / name).resolve()
    if not _STEP.fullmatch(name) or folder.parent != root.resolve() or not folder.is_dir():
        raise CheckpointError(f"{pointer}: names {name[:100]!r}, which is not a checkpoint folder (step-NNNNNN) "
                              f"inside {root}")
    return folder


def load_latest(root: str | Path) -> tuple[dict, dict] | None:
    """(learner state, run state with "step") of the latest checkpoint, restoring the driver's RNG
    states; None when there is no checkpoint."""
    folder = checkpoint_folder(Path(root))
    if folder is None:
        return None
    state = json.loads((folder / "state.json").read_text())
    learner_state = _safe_load(folder / "learner.pt")
    _set_rng_state(_safe_load(folder / "rng.pt"))
    return learner_state, state
