"""The exemplar corpus: chunks of (short history, counselor response) with their provenance.

Owns: turning ESConv train dialogues or ESC-Preference pairs into chunks, dropping duplicates and
very short responses, refusing the test split (and any pair from it), and the checksum that the index
manifest records.

A chunk is ``{"id", "history", "response", "dialogue_id", "strategies", "stage", "problem", "emotion",
"source"}``; ``history`` is the last ``chunk_turns`` turns as "Client: ... / Counselor: ..." lines
(``escrag.prompts.chunk_history``) and the text that gets embedded is
``escrag.prompts.chunk_text(history, response)``. The labels travel with every hit and into the stage-2
prompt: ``strategies`` are the ESConv strategies of the gold turn (the chosen trajectory's strategy for
a preference pair), ``problem`` and ``emotion`` the dialogue's ESConv problem and emotion type, ``stage``
the counseling stage a preference pair's chosen trajectory named ("" where the source has none: ESConv
labels no stage).

Departures from the paper: the paper's corpus is the preferred responses of ESC-Preference
(``source = "prefs"``). So that the embedded default has a corpus before any preference data exists,
``source = "esconv"`` uses the gold counselor turns of ESConv train instead. Responses shorter than
``min_response_chars`` (greetings, "Hello!") are dropped, and chunks with identical text are kept once,
so the k exemplars are k different pieces of guidance.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path

from escrag.data import load_states, resolve_path
from escrag.errors import UserError
from escrag.prompts import chunk_history, chunk_text

CHUNK_FIELDS = ("id", "history", "response", "dialogue_id", "strategies", "stage", "problem", "emotion", "source")
LABEL_FIELDS = ("strategies", "stage", "problem", "emotion")  # what a hit carries beside its text


def embed_text(chunk: dict) -> str:
    """The text a chunk is embedded as."""
    return chunk_text(chunk["history"], chunk["response"])


def esconv_chunks(split: str, test_split: str, turns: int, chars: int) -> list[dict]:
    """One chunk per dialogue state of ``split`` (gold counselor turn + preceding turns)."""
    if resolve_path(split).resolve() == resolve_path(test_split).resolve():
        raise UserError(f"data.train={split!r} is the test split ({test_split!r}); the retrieval corpus "
                        "must not contain test dialogues")
    return [{"id": f"{s.dialogue_id}/{s.turn_index}", "history": chunk_history(s.history, turns, chars),
             "response": s.target, "dialogue_id": s.dialogue_id, "strategies": list(s.strategies), "stage": "",
             "problem": s.problem, "emotion": s.emotion, "source": "esconv"} for s in load_states(split)]


def pref_chunks(path: str | Path, test_split: str, turns: int, chars: int) -> list[dict]:
    """One chunk per pair: its history and the preferred (``chosen``) reply. A pair from the test split
    is refused (``escrag.pairs.refuse_split``), never skipped in silence."""
    from escrag.pairs import load_pairs, refuse_split

    pairs = load_pairs(path)
    refuse_split(pairs, test_split, f"the retrieval index ({path})")
    chunks = []
    for pair in pairs:
        prov = pair.provenance
        strategy = prov.get("strategy") or []
        chunks.append({"id": pair.id, "history": chunk_history(pair.history, turns, chars),
                       "response": pair.chosen.strip(), "dialogue_id": str(prov.get("dialogue_id", "")),
                       "strategies": list(strategy) if isinstance(strategy, list) else [str(strategy)],
                       **{k: str(prov.get(k) or "") for k in ("stage", "problem", "emotion")},
                       "source": "prefs"})
    return chunks


def clean(chunks: Iterable[dict], min_response_chars: int) -> list[dict]:
    """Drop short responses and repeated chunk texts (first one kept); ids must be unique."""
    seen_text, seen_id, out = set(), set(), []
    for c in chunks:
        text = embed_text(c)
        if len(c["response"].strip()) < min_response_chars or text in seen_text:
            continue
        if c["id"] in seen_id:
            raise UserError(f"chunk id {c['id']!r} appears twice in the corpus source")
        seen_text.add(text)
        seen_id.add(c["id"])
        out.append(c)
    return out


def build_corpus(cfg, source: str | None = None, pairs: str | None = None,
                 limit: int | None = None) -> list[dict]:
    """Chunks for ``cfg`` (a full ``Config``); ``source``/``pairs`` override ``cfg.retriever``."""
    rc = cfg.retriever
    source = source or rc.source
    if source == "esconv":
        raw = esconv_chunks(cfg.data.train, cfg.data.test, rc.chunk_turns, rc.chunk_chars)
    elif source == "prefs":
        pairs = pairs or rc.pairs
        if not pairs:
            raise UserError("source 'prefs' needs a pairs file (--pairs FILE or retriever.pairs)")
        raw = pref_chunks(pairs, cfg.data.test, rc.chunk_turns, rc.chunk_chars)
    else:
        raise UserError(f"unknown corpus source {source!r} (known: esconv, prefs)")
    chunks = clean(raw, rc.min_response_chars)
    limit = limit if limit is not None else rc.max_chunks
    if limit is not None:
        if limit < 1:
            raise UserError(f"limit must be >= 1, got {limit}")
        chunks = chunks[:limit]
    if not chunks:
        raise UserError(f"the {source} corpus is empty after dropping responses shorter than "
                        f"{rc.min_response_chars} characters")
    return chunks


def dump_chunks(chunks: list[dict]) -> bytes:
    """Canonical JSONL bytes of a corpus (what is saved, and what the checksum covers)."""
    lines = (json.dumps({k: c[k] for k in CHUNK_FIELDS}, ensure_ascii=False, sort_keys=True) for c in chunks)
    return ("\n".join(lines) + "\n").encode("utf-8")


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
