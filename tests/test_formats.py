"""The strict output parser and format reward (eq. 4): accepted shapes and >= ten malformed ones.
Run: .venv/bin/python -m pytest -q tests/test_formats.py"""

import pytest

from escrag.formats import format_reward, format_rewards, parse_output, reply_text, response_text

pytestmark = pytest.mark.unit

GOOD = [
    "<think>She feels anxious.</think><response>That sounds really hard.</response>",
    "  \n<think>a</think>\n\n<response>b</response>\n ",
    "<think>multi\nline</think> <response>line one\nline two</response>",
]

BAD = {
    "empty": "",
    "plain text": "That sounds hard.",
    "unclosed think": "<think>reasoning<response>reply</response>",
    "unclosed response": "<think>r</think><response>reply",
    "reversed order": "<response>reply</response><think>r</think>",
    "text before": "Sure! <think>r</think><response>reply</response>",
    "text between": "<think>r</think> so <response>reply</response>",
    "text after": "<think>r</think><response>reply</response> Hope this helps",
    "repeated response": "<think>r</think><response>a</response><response>b</response>",
    "repeated think": "<think>r</think><think>s</think><response>a</response>",
    "nested think in response": "<think>r</think><response>a <think>x</think></response>",
    "nested response in think": "<think><response>x</response></think><response>a</response>",
    "empty response": "<think>r</think><response>   </response>",
    "empty think": "<think></think><response>a</response>",
    "only response": "<response>a</response>",
    "only think": "<think>r</think>",
    "stray close tag": "<think>r</think></think><response>a</response>",
    "uppercase tags": "<THINK>r</THINK><RESPONSE>a</RESPONSE>",
}


@pytest.mark.parametrize("text", GOOD)
def test_good_outputs_parse(text):
    parsed = parse_output(text)
    assert parsed.ok and parsed.reason == ""
    assert format_reward(text) == 1.0
    assert parsed.response == parsed.response.strip() and parsed.response


def test_parse_extracts_both_blocks():
    parsed = parse_output(GOOD[0])
    assert parsed.think == "She feels anxious."
    assert parsed.response == "That sounds really hard."


@pytest.mark.parametrize("name", sorted(BAD))
def test_malformed_outputs_get_zero_with_reason(name):
    parsed = parse_output(BAD[name])
    assert not parsed.ok and parsed.reason, name
    assert format_reward(BAD[name]) == 0.0


def test_non_string_is_rejected():
    assert format_reward(None) == 0.0  # type: ignore[arg-type]


def test_batch_rewards_and_response_text():
    assert format_rewards([GOOD[0], BAD["plain text"]]) == [1.0, 0.0]
    assert response_text(GOOD[0]) == "That sounds really hard."
    assert response_text(BAD["unclosed response"]) == BAD["unclosed response"]  # raw text when unparsed


@pytest.mark.parametrize("output,shown", [
    ("<think>plan: ask about the pills</think>", "initial reply"),  # no response block at all
    ("<think>plan: ask about the pills and then", "initial reply"),  # cut off by max_tokens
    ("ask about the pills</think> I hear you.", "I hear you."),  # a stray closing tag
    ("<think>plan</think> I hear you.", "I hear you."),  # the response tags left out
    ("<think>plan</think><response>I hear you.", "I hear you."),  # the response cut off
    ("I hear you.", "I hear you."),  # no tags: a plain answer is shown
])
def test_reply_text_never_shows_the_think_text(output, shown):
    assert reply_text(output, fallback="initial reply") == shown
