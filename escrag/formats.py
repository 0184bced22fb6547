"""The policy's output format and the rule-based format reward (paper eq. 4).

Owns: the output-format tags (the only place they are spelt), the strict parser of
``<think>...</think><response>...</response>``, ``format_reward``, ``compose`` (the format from its
two parts) and ``reply_text`` (what a client is shown of any output).

The format holds when the whole output is exactly one think block followed by one response block,
with nothing but whitespace before, between and after, no tag of either kind inside either block, and
non-empty text in both blocks. The paper only says "format satisfied"; the strictness (and requiring a
non-empty think block) is our reading, chosen so that the reward cannot be gamed by padding.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
RESPONSE_OPEN, RESPONSE_CLOSE = "<response>", "</response>"
TAGS = (THINK_OPEN, THINK_CLOSE, RESPONSE_OPEN, RESPONSE_CLOSE)
_SHAPE = re.compile(r"\A\s*<think>(.*?)</think>\s*<response>(.*?)</response>\s*\Z", re.DOTALL)
_ANY_TAG = re.compile(r"</?(think|response)>")
_THINKING = re.compile(r"<think>.*?(?:</think>|\Z)", re.DOTALL)  # a think block, or one cut off


@dataclass(frozen=True)
class ParsedOutput:
    ok: bool
    think: str = ""
    response: str = ""
    reason: str = ""  # why parsing failed; empty when ok


def _fail(reason: str) -> ParsedOutput:
    return ParsedOutput(False, reason=reason)


def parse_output(text: str) -> ParsedOutput:
    """Parse a policy output strictly; on failure, ``reason`` says what is wrong."""
    if not isinstance(text, str):
        return _fail("output is not a string")
    counts = {tag: text.count(tag) for tag in TAGS}
    for tag, n in counts.items():
        if n != 1:
            return _fail(f"expected exactly one {tag}, found {n}")
    m = _SHAPE.match(text)
    if m is None:
        return _fail("blocks out of order or text outside <think>...</think><response>...</response>")
    think, response = m.group(1).strip(), m.group(2).strip()
    if _ANY_TAG.search(think) or _ANY_TAG.search(response):
        return _fail("nested tag inside a block")
    if not think:
        return _fail("empty think block")
    if not response:
        return _fail("empty response block")
    return ParsedOutput(True, think, response)


def format_reward(text: str) -> float:
    """1.0 when ``parse_output`` accepts the output, else 0.0 (eq. 4)."""
    return 1.0 if parse_output(text).ok else 0.0


def format_rewards(texts: list[str]) -> list[float]:
    return [format_reward(t) for t in texts]


def compose(think: str, response: str) -> str:
    """An output in the format: ``<think>think</think><response>response</response>``."""
    return f"{THINK_OPEN}{think.strip()}{THINK_CLOSE}{RESPONSE_OPEN}{response.strip()}{RESPONSE_CLOSE}"


def reply_text(output: str, fallback: str = "") -> str:
    """The client-facing text of an output: the response block when the format parses; else the text
    after an opening response tag (or the whole output) with the reasoning removed (a think block,
    closed or cut off, and whatever precedes a stray closing think tag) and every tag removed;
    ``fallback`` when that is empty. The think text never reaches the client, whatever the format."""
    parsed = parse_output(output)
    if parsed.ok:
        return parsed.response
    if RESPONSE_OPEN in output:
        output = output.split(RESPONSE_OPEN, 1)[1].split(RESPONSE_CLOSE, 1)[0]
    else:
        output = _THINKING.sub("", output)
        output = output.rsplit(THINK_CLOSE, 1)[-1]
    return _ANY_TAG.sub("", output).strip() or fallback.strip()


def response_text(text: str) -> str:
    """The response block when the format parses, else the raw output (design section 3): the
    retrieval query after stage 1 and the text the reward model scores."""
    parsed = parse_output(text)
    return parsed.response if parsed.ok else text
