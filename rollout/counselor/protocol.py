"""Request schema of the counselor's OpenAI-compatible ``POST /v1/chat/completions``.

Owns: the pydantic request model and its validation (roles, content shape, the last turn being the
client's, ``n == 1``). Unknown OpenAI fields (``frequency_penalty``, ``user``, ...) are accepted and
ignored, as with OpenAI-compatible servers in general. Kept free of torch and the engine.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

MAX_TOKENS_LIMIT = 4096


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant"]
    content: str | list[TextPart]

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class ChatCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str = "escrag-counselor"
    messages: list[ChatMessage] = Field(min_length=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)  # None: rollout.temperature
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    max_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS_LIMIT)  # of the final (stage-2) output
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS_LIMIT)
    seed: int | None = None
    n: int = 1
    stream: bool = False

    @field_validator("n")
    @classmethod
    def _one_choice(cls, n: int) -> int:
        if n != 1:
            raise ValueError("only n=1 is supported")
        return n

    @model_validator(mode="after")
    def _ends_with_client(self):
        if self.messages[-1].role != "user":
            raise ValueError("the last message must have role 'user' (the client's turn)")
        if not self.messages[-1].text().strip():
            raise ValueError("the last user message is empty")
        return self

    def history(self) -> list[dict]:
        """The dialogue as the policy sees it: user/assistant turns; our own system prompt replaces
        any system message the caller sent."""
        return [{"role": m.role, "content": m.text()} for m in self.messages if m.role != "system"]

    def new_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens
