"""ESConv loading and dialogue states on the real bundled records: split sizes, merged turns, roles,
no state without a preceding client turn, and clear errors for malformed files.
Run: .venv/bin/python -m pytest -q tests/test_data.py"""

import json

import pytest

from escrag.data import DataError, load_dialogues, load_states, merge_turns, split_stats

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("split,count", [("train", 910), ("valid", 195), ("test", 195)])
def test_split_sizes_match_paper(split, count):
    assert len(load_dialogues(split)) == count


def test_first_train_dialogue_merges_runs_of_one_speaker():
    d = load_dialogues("train")[0]
    roles = [t.role for t in d.turns]
    assert all(a != b for a, b in zip(roles, roles[1:])), "consecutive turns must alternate"
    # In the raw record, utterances 8-10 are three client messages in a row ("It's not ending yet...",
    # "you have to have been here for a year...", "I'm afraid that I will lose my job...").
    merged = next(t for t in d.turns if t.content.startswith("It's not ending yet"))
    assert "you have to have been here for a year" in merged.content
    assert merged.content.endswith("for the foreseeable future.")
    assert merged.role == "user"


def test_states_end_in_client_turn_and_target_is_counselor():
    states = load_states("train")
    assert len(states) > 10_000
    for s in states[:2000]:
        assert s.history and s.history[-1]["role"] == "user"
        assert {m["role"] for m in s.history} <= {"user", "assistant"}
        assert s.target and s.strategies
    first = states[0]
    assert first.history == [{"role": "user", "content": "Hello good afternoon."}]
    assert first.target == "Hi, good afternoon."
    assert first.strategies == ("Question",)
    assert first.emotion == "anxiety" and first.problem == "job crisis"
    assert first.dialogue_id == "train-1" and first.turn_index == 1


def test_counselor_opening_yields_no_state(tmp_path):
    rec = {"situation": "s", "emotion_type": "sadness", "problem_type": "p", "dialog": [
        {"speaker": "sys", "text": "Hello, how can I help?", "strategy": "Question"},
        {"speaker": "usr", "text": "I feel low."}, {"speaker": "usr", "text": "Really low."},
        {"speaker": "sys", "text": "I hear you.", "strategy": "Reflection of feelings"},
        {"speaker": "sys", "text": "What happened?", "strategy": "Question"}]}
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(rec) + "\n")
    states = load_states(path)
    assert len(states) == 1
    s = states[0]
    assert s.history == [{"role": "assistant", "content": "Hello, how can I help?"},
                         {"role": "user", "content": "I feel low. Really low."}]
    assert s.target == "I hear you. What happened?"
    assert s.strategies == ("Reflection of feelings", "Question")


def test_merge_drops_empty_utterances():
    turns = merge_turns([("usr", "a", None), ("usr", "", None), ("sys", "b", "Question")])
    assert [t.content for t in turns] == ["a", "b"]


@pytest.mark.parametrize("line,needle", [
    ("{not json", "invalid JSON"),
    ("[1, 2]", "not a JSON object"),
    ('{"dialog": []}', "'dialog' must be a non-empty list"),
    ('{"dialog": [{"speaker": "bot", "text": "x"}]}', "dialog[0]: 'speaker'"),
    ('{"dialog": [{"speaker": "usr", "text": 3}]}', "'text' must be a string"),
    ('{"dialog": [{"speaker": "usr", "text": "x"}], "situation": 5}', "'situation' must be a string"),
])
def test_malformed_record_names_file_and_line(tmp_path, line, needle):
    good = json.dumps({"dialog": [{"speaker": "usr", "text": "hi"}]})
    path = tmp_path / "bad.jsonl"
    path.write_text(good + "\n" + line + "\n")
    with pytest.raises(DataError) as err:
        load_dialogues(path)
    assert f"{path}:2" in str(err.value) and needle in str(err.value)


def test_missing_file_is_clear():
    with pytest.raises(DataError, match="no such ESConv file"):
        load_states("/nonexistent/esconv.jsonl")


def test_stats_count_strategies():
    s = split_stats("valid")
    assert s["dialogues"] == 195 and s["states"] > 1000
    # every state has at least one strategy; merged counselor turns can carry several
    assert sum(s["strategies"].values()) >= s["states"]
    assert set(s["strategies"]) <= {"Question", "Restatement or Paraphrasing", "Reflection of feelings",
                                    "Self-disclosure", "Affirmation and Reassurance",
                                    "Providing Suggestions", "Information", "Others"}
