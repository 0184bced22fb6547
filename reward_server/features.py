"""On-disk cache of frozen-backbone features, so each (history, reply) runs through f_θ once.

Owns: ``FeatureCache`` and ``cached_features``. Because the backbone is frozen (paper 3.3), its
last-token feature of an input never changes; training the linear head for many epochs then needs no
backbone pass at all after the first.

Layout: ``<root>/<feature id>/shard-*.npz`` (the backbone fingerprint, plus the layer and pooling read
when they are not the last layer's last token), each shard holding ``keys`` (hex sha256 of the feature id and
the exact input token ids, i.e. the rendered and truncated text, which also fix where the reply starts)
and ``feats`` (float32 [n, H]). New features are written in shards of ``SHARD_ROWS`` as they are
computed (temp file, then rename), so an interrupted run resumes where it stopped.
"""

from __future__ import annotations

import hashlib
import uuid
from pathlib import Path

import numpy as np

from escrag.atomic import atomic_file
from escrag.progress import progress_bar

SHARD_ROWS = 256


def default_root() -> Path:
    from escrag.models import cache_dir

    return cache_dir() / "rm-features"


class FeatureCache:
    def __init__(self, root: str | Path | None, fingerprint: str, hidden_size: int):
        self.dir = Path(root or default_root()) / fingerprint
        self.dir.mkdir(parents=True, exist_ok=True)
        self.fingerprint, self.hidden_size = fingerprint, hidden_size
        self._rows: dict[str, np.ndarray] = {}
        self._loaded: set[str] = set()

    def key(self, ids: list[int]) -> str:
        h = hashlib.sha256(self.fingerprint.encode())
        h.update(np.asarray(ids, dtype=np.int64).tobytes())
        return h.hexdigest()

    def _refresh(self) -> None:
        for shard in sorted(self.dir.glob("shard-*.npz")):
            if shard.name in self._loaded:
                continue
            with np.load(shard) as data:
                if data["feats"].shape[1] != self.hidden_size:
                    continue  # cannot happen for one fingerprint; ignore rather than crash
                for k, row in zip(data["keys"].tolist(), data["feats"]):
                    self._rows[k] = row
            self._loaded.add(shard.name)

    def get(self, keys: list[str]) -> dict[str, np.ndarray]:
        self._refresh()
        return {k: self._rows[k] for k in keys if k in self._rows}

    def add(self, keys: list[str], feats: np.ndarray) -> None:
        name = f"shard-{uuid.uuid4().hex[:12]}.npz"
        with atomic_file(self.dir / name, "wb") as fh:
            np.savez(fh, keys=np.asarray(keys), feats=np.asarray(feats, dtype=np.float32))
        self._loaded.add(name)
        self._rows.update(zip(keys, np.asarray(feats, dtype=np.float32)))


def cached_features(backbone, encs: list, cache: FeatureCache, batch_size: int,
                    desc: str = "backbone features") -> tuple[np.ndarray, dict]:
    """Features [n, H] for encoded inputs (``reward_server.model.Encoded``), running the backbone only on
    those not yet cached.

    Returns the features and {"cached": hits, "computed": sequences run through the backbone}.
    Unique missing sequences are sorted by length before batching to waste little padding.
    """
    keys = [cache.key(e.ids) for e in encs]
    have = cache.get(keys)
    todo = sorted({k: e for k, e in zip(keys, encs) if k not in have}.items(), key=lambda kv: len(kv[1].ids))
    with progress_bar(total=len(todo), desc=desc, unit="seq", disable=not todo) as bar:
        for start in range(0, len(todo), SHARD_ROWS):
            chunk = todo[start:start + SHARD_ROWS]
            feats = []
            for b in range(0, len(chunk), batch_size):
                batch = [s for _, s in chunk[b:b + batch_size]]
                feats.append(backbone.features(batch).numpy())
                bar.update(len(batch))
            cache.add([k for k, _ in chunk], np.concatenate(feats))
    have = cache.get(keys)
    return np.stack([have[k] for k in keys]), {"cached": len(keys) - len(todo), "computed": len(todo)}
