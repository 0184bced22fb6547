"""Prompt templates (paper Appendix B): stage 1, stage 2 with exemplars, reward-model input, chunk text.

Owns: every string the policy, the reward model and the retriever see, built as OpenAI-style
messages and rendered through the tokenizer's chat template by ``render``.

Departures from the paper: Appendix B gives the prompts only as figures. Ours follow their described
content: stage 1 asks for ``<think>`` reasoning then a ``<response>``; stage 2 continues the same
conversation: the stage-1 output as the assistant's turn, then a system turn with the k exemplars and
the instruction to write the final response (``feedback_message``), so the stage-2 input is the
stage-1 input plus ĉ plus that turn (eq. 8's π(·|H, ĉ, E), laid out the way a multi-turn agent
framework such as OpenRLHF builds it). The reward-model input is the history plus the candidate reply
as the final assistant turn. Long histories keep their last ``max_turns`` turns (None keeps all).
"""

from __future__ import annotations

from collections.abc import Sequence

Message = dict  # {"role": "system"|"user"|"assistant", "content": str}

COUNSELOR_ROLE = (
    "You are a professional counselor providing emotional support to a client. Understand the "
    "client's situation and feelings, then reply warmly and concisely, without lecturing."
)
FORMAT_RULE = (
    "First reason briefly about the client's state and the best support strategy inside "
    "<think></think>, then write only your reply to the client inside <response></response>."
)
STAGE1_SYSTEM = f"{COUNSELOR_ROLE}\n{FORMAT_RULE}"
FEEDBACK_INSTRUCTION = (
    "Above is your initial response. Below are reference exemplars from experienced counselors in "
    "similar conversations. Use them as guidance, not as text to copy, and write an improved final "
    f"response to the client.\n{FORMAT_RULE}"
)
RM_SYSTEM = (
    "Judge whether the counselor's last reply effectively addresses the client's emotional problem "
    "given the conversation so far."
)
ROLE_NAMES = {"user": "Client", "assistant": "Counselor"}


def _tail(history: Sequence[Message], max_turns: int | None) -> list[Message]:
    turns = list(history)
    return turns[-max_turns:] if max_turns else turns


def stage1_messages(history: Sequence[Message], max_turns: int | None = None) -> list[Message]:
    """Prompt for the initial response: ĉ ~ π(·|H) (eq. 7)."""
    return [{"role": "system", "content": STAGE1_SYSTEM}, *_tail(history, max_turns)]


def exemplar_labels(ex: dict) -> str:
    """" Strategy: Question. Problem: job crisis." from a hit's labels (those it has), else ""."""
    parts = [("Strategy", ", ".join(ex.get("strategies") or ())), ("Stage", ex.get("stage")),
             ("Problem", ex.get("problem")), ("Emotion", ex.get("emotion"))]
    return "".join(f" {name}: {value}." for name, value in parts if value)


def format_exemplars(exemplars: Sequence[dict]) -> str:
    """Exemplars as numbered (labels, history, response) blocks; each dict has ``history`` and
    ``response``, and the labels a retriever hit carries (``exemplar_labels``)."""
    blocks = []
    for i, ex in enumerate(exemplars, 1):
        blocks.append(f"[Exemplar {i}]{exemplar_labels(ex)}\n{ex['history']}\nCounselor: {ex['response']}")
    return "\n\n".join(blocks) if blocks else "(no exemplars retrieved)"


def feedback_message(exemplars: Sequence[dict]) -> Message:
    """The turn that opens stage 2: the retrieved exemplars E and the instruction (eq. 8)."""
    return {"role": "system", "content": f"{FEEDBACK_INSTRUCTION}\n\n## Exemplars\n{format_exemplars(exemplars)}"}


def stage2_messages(history: Sequence[Message], stage1_output: str, exemplars: Sequence[dict],
                    max_turns: int | None = None) -> list[Message]:
    """Prompt for the retrieval-augmented final response: c ~ π(·|H, ĉ, E) (eq. 8)."""
    return [*stage1_messages(history, max_turns), {"role": "assistant", "content": stage1_output.strip()},
            feedback_message(exemplars)]


def rm_messages(history: Sequence[Message], response: str, max_turns: int | None = None) -> list[Message]:
    """Reward-model input (eq. 2): the history with the candidate reply as the last assistant turn."""
    return [{"role": "system", "content": RM_SYSTEM}, *_tail(history, max_turns),
            {"role": "assistant", "content": response.strip()}]


def transcript(history: Sequence[Message], max_chars: int | None = None) -> str:
    """Plain "Client: ... / Counselor: ..." lines; with ``max_chars``, keeps the end."""
    text = "\n".join(f"{ROLE_NAMES.get(m['role'], m['role'])}: {m['content']}" for m in history
                     if m["role"] in ROLE_NAMES)
    if max_chars and len(text) > max_chars:
        text = "..." + text[-max_chars:]
    return text


def chunk_history(history: Sequence[Message], max_turns: int, max_chars: int) -> str:
    """The short history of a retrieval chunk: the last ``max_turns`` turns, at most ``max_chars``
    (``retriever.chunk_turns``, ``retriever.chunk_chars``)."""
    return transcript(_tail(history, max_turns), max_chars)


def chunk_text(history: str, response: str) -> str:
    """The text a retrieval chunk is embedded and shown as."""
    return f"{history}\nCounselor: {response.strip()}"


def render(tokenizer, messages: Sequence[Message], add_generation_prompt: bool = True) -> str:
    """Messages -> prompt string through the tokenizer's chat template."""
    return tokenizer.apply_chat_template(list(messages), tokenize=False,
                                         add_generation_prompt=add_generation_prompt)
