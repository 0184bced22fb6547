"""Append-only JSONL caches keyed by a content hash: the evaluation's answers and scores, and every
model call of preference construction.

Owns: ``JsonlCache`` and ``content_key``. Each finished item is appended as one line and flushed at
once, so a crash loses at most the line being written; a torn last line (or any line that is not JSON)
is skipped when the file is read back. Keys are sha256 hashes of everything that changes the cached
value, built by the callers (``evaluation.systems.answer_key``, ``escrag.llm.judge.Judge.key``,
``escrag.preference.build.call_key``), so a rerun with the same inputs finds every item and makes no call,
and any change of input misses the cache.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from escrag.atomic import json_text


def content_key(obj) -> str:
    """sha256 of a JSON-able object with sorted keys."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, ensure_ascii=False).encode("utf-8", "surrogatepass")).hexdigest()


class JsonlCache:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.items: dict[str, dict] = {}
        self.skipped = 0  # unreadable lines (a crash mid-write leaves at most one)
        if self.path.is_file():
            for line in self.path.read_text(encoding="utf-8").splitlines():
                try:
                    obj = json.loads(line)
                    self.items[obj["key"]] = obj["value"]
                except (ValueError, KeyError, TypeError):
                    self.skipped += 1

    def get(self, key: str) -> dict | None:
        return self.items.get(key)

    def __contains__(self, key: str) -> bool:
        return key in self.items

    def put(self, key: str, value: dict) -> None:
        self.items[key] = value
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(json_text({"key": key, "value": value}) + "\n")
