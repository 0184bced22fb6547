"""Request and response schemas of the reward server (design section 3). No heavy imports.

``POST /score``: ``{"items": [{"history": [{"role", "content"}...], "output": str}]}`` ->
``{"rewards": [float], "rm_scores": [float], "format_rewards": [float]}``.

``POST /get_reward`` (OpenRLHF remote reward model): ``{"query": [str], "prompts": [str], "labels": [...]}``
-> ``{"rewards": [float], "scores": [float], "extra_logs": {"rm_scores": [...], "format_rewards": [...]}}``.
Each ``query`` is the prompt followed by the policy's output, so ``prompts`` is required and each
query must start with its prompt: output = ``query[len(prompt):]`` minus trailing end-of-turn tokens.
The history is read from the prompt's ChatML turns (``<|im_start|>role ... <|im_end|>``, the template
of Qwen2.5 and SmolLM2): system turns are dropped, user/assistant turns kept; a prompt without ChatML
turns becomes one user turn. ``labels`` are accepted and ignored.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")  # OpenAI messages may carry e.g. "name"
    role: Literal["user", "assistant"]
    content: str


class ScoreItem(BaseModel):
    model_config = ConfigDict(extra="forbid")
    history: list[Message] = Field(min_length=1)
    output: str

    @field_validator("history")
    @classmethod
    def _ends_with_client(cls, history: list[Message]) -> list[Message]:
        if history[-1].role != "user":
            raise ValueError("history must end with a user (client) turn")
        return history


class ScoreRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    items: list[ScoreItem] = Field(min_length=1)


class ScoreResponse(BaseModel):
    rewards: list[float]  # rm_scores + format_rewards (eq. 5)
    rm_scores: list[float]  # r_RM (eq. 2), or the rule's score under --rule
    format_rewards: list[float]  # r_format (eq. 4)


class GetRewardRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    query: list[str] = Field(min_length=1)
    prompts: list[str] | None = None
    labels: list[Any] | None = None

    @model_validator(mode="after")
    def _prompts_match(self):
        if self.prompts is None:
            raise ValueError("prompts is required: each query is split into its prompt and the output")
        if len(self.prompts) != len(self.query):
            raise ValueError(f"{len(self.query)} queries but {len(self.prompts)} prompts")
        for i, (q, p) in enumerate(zip(self.query, self.prompts)):
            if not q.startswith(p):
                raise ValueError(f"query[{i}] does not start with prompts[{i}]")
        return self


_CHATML = re.compile(r"<\|im_start\|>(system|user|assistant)\n(.*?)(?:<\|im_end\|>|\Z)", re.DOTALL)
END_TOKENS = ("<|im_end|>", "<|endoftext|>", "</s>", "<|eot_id|>")


def prompt_history(prompt: str) -> list[dict]:
    """The client/counselor turns of a rendered ChatML prompt (see module docstring)."""
    turns = [{"role": r, "content": c.strip()} for r, c in _CHATML.findall(prompt) if r != "system"]
    while turns and turns[-1]["role"] == "assistant" and not turns[-1]["content"]:
        turns.pop()  # the generation prompt "<|im_start|>assistant\n"
    if not turns or turns[-1]["role"] != "user":
        return [{"role": "user", "content": prompt.strip()}]
    return turns


def query_output(query: str, prompt: str) -> str:
    out = query[len(prompt):].rstrip()
    stripped = True
    while stripped:
        stripped = False
        for tok in END_TOKENS:
            if out.endswith(tok):
                out, stripped = out[: -len(tok)].rstrip(), True
    return out
