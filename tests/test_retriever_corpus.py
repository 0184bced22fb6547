"""The retrieval corpus: ESConv chunks come from train only (the test split never enters by default,
and asking for it is refused), preference-pair chunks hold the chosen reply and a test-split pair is
refused by name, short and repeated chunks are dropped, ``limit`` keeps the first N. No model is loaded.
Run: .venv/bin/python -m pytest -q tests/test_retriever_corpus.py"""

import json

import pytest

from escrag.config import from_dict, load_config
from escrag.data import DataError, load_states
from escrag.errors import UserError
from escrag.prompts import chunk_history
from retriever_server.corpus import CHUNK_FIELDS, build_corpus, clean, dump_chunks, embed_text


@pytest.fixture(scope="module")
def esconv_corpus():
    return build_corpus(load_config())


def test_default_corpus_is_esconv_train_only(esconv_corpus):
    assert len(esconv_corpus) > 9000  # ~10k train states minus short/duplicate turns
    assert all(set(c) == set(CHUNK_FIELDS) and c["source"] == "esconv" for c in esconv_corpus)
    assert {c["dialogue_id"].split("-")[0] for c in esconv_corpus} == {"train"}
    # content check too: no substantial test-split counselor turn is in the corpus
    responses = {c["response"] for c in esconv_corpus}
    test_targets = [s.target for s in load_states("test") if len(s.target) > 60]
    assert len(test_targets) > 500 and not [t for t in test_targets if t in responses]


def test_chunks_hold_short_history_and_gold_turn(esconv_corpus):
    state = next(s for s in load_states("train") if len(s.history) >= 3 and len(s.target) > 40)
    chunk = next(c for c in esconv_corpus if c["id"] == f"{state.dialogue_id}/{state.turn_index}")
    assert chunk["response"] == state.target
    assert chunk["history"] == chunk_history(state.history, 2, 400)
    assert chunk["history"].splitlines()[-1].startswith("Client: ")
    assert embed_text(chunk).endswith(f"Counselor: {state.target}")
    assert all(len(c["response"]) >= 16 for c in esconv_corpus)
    assert len({embed_text(c) for c in esconv_corpus}) == len(esconv_corpus)


def test_test_split_is_refused_and_limit_applies(esconv_corpus):
    with pytest.raises(UserError, match="test split"):
        build_corpus(from_dict({}, ["data.train=test"]))
    assert build_corpus(load_config(), limit=5) == esconv_corpus[:5]
    with pytest.raises(UserError, match="limit"):
        build_corpus(load_config(), limit=0)
    with pytest.raises(UserError, match="pairs file"):
        build_corpus(load_config(), source="prefs")


def _pair(pid, split, chosen, rejected="Cheer up."):
    return {"id": pid, "history": [{"role": "user", "content": f"I feel bad ({pid})"}], "chosen": chosen,
            "rejected": rejected, "provenance": {"split": split, "dialogue_id": f"{split}-1"}}


def test_pref_chunks_take_chosen_and_refuse_test_pairs(tmp_path):
    path = tmp_path / "pairs.jsonl"
    rows = [_pair("a", "train", "That sounds really hard, tell me more."),
            _pair("c", "train", "ok")]  # too short: dropped
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    chunks = build_corpus(load_config(), source="prefs", pairs=str(path))
    assert [(c["id"], c["response"], c["source"]) for c in chunks] == \
        [("a", "That sounds really hard, tell me more.", "prefs")]
    assert chunks[0]["history"] == "Client: I feel bad (a)"
    # a pair from the test split is refused with its id, not skipped in silence (by split or dialogue id)
    for bad in (_pair("b", "test", "A test-split reply that must not leak."),
                {**_pair("b", "train", "A reply."), "provenance": {"dialogue_id": "test-4"}}):
        path.write_text("".join(json.dumps(r) + "\n" for r in [rows[0], bad]))
        with pytest.raises(DataError, match=r"pair 'b' comes from the test split 'test'.*retrieval index"):
            build_corpus(load_config(), source="prefs", pairs=str(path))
    path.write_text('{"id": "x", "history": [], "chosen": 1}\n')
    with pytest.raises(DataError, match=r"pairs.jsonl:1"):
        build_corpus(load_config(), source="prefs", pairs=str(path))


def test_clean_and_checksum_bytes():
    a = {"id": "1", "history": "Client: hi", "response": "I hear you, that is hard.", "dialogue_id": "d",
         "strategies": [], "stage": "", "problem": "", "emotion": "", "source": "esconv"}
    assert clean([a, dict(a, id="2"), dict(a, id="3", response="Hi")], 16) == [a]
    with pytest.raises(UserError, match="appears twice"):
        clean([a, dict(a, response="Another long enough reply.")], 16)
    assert dump_chunks([a]) == dump_chunks([dict(reversed(list(a.items())))])  # key order is canonical
