"""Schemas of the counselor's OpenAI-compatible ``POST /v1/chat/completions`` and ``GET /v1/models``.

Owns: the pydantic request model and its validation (roles, content shape, the last turn being the
client's, ``n == 1``); the service's typed result ``CounselorAnswer``; and the response models: the
chat completion, the streaming chunk (sent with ``exclude_unset``, as vLLM does, so a delta carries
only what it sets and only the last chunk the ``escrag`` field) and the model list. The ``escrag``
field (``EscragInfo``) is our addition to OpenAI's shape. Unknown OpenAI request fields
(``frequency_penalty``, ``user``, ...) are accepted and ignored, as with OpenAI-compatible servers in
general. Kept free of torch and the engine.
"""

from __future__ import annotations

from typing import Any, Literal

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
    # ours, not OpenAI's: exemplars retrieved for this request (None: the server's retriever.k), so one
    # server answers a k-sweep (evaluation/systems.py); 400 on a server without retrieval
    retrieval_k: int | None = Field(None, ge=1, le=50)

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


# ---------------------------------------------------------------------------------- responses


class Usage(BaseModel):
    prompt_tokens: int  # over both stages
    completion_tokens: int  # over both stages
    total_tokens: int


class EscragInfo(BaseModel):
    """The top-level ``escrag`` field: how the reply came about."""

    think: str  # the final output's <think> block ("" when the format does not parse)
    initial: str  # the stage-1 response text ĉ ("" without RAG)
    exemplars: list[dict[str, Any]]  # the retriever's hits as it sent them (retriever_server.protocol.Hit)
    risk: Literal["none", "elevated", "high"]  # escrag.safety over the whole conversation
    reasons: list[str]
    categories: list[str]
    output: str  # the raw final output
    format_ok: bool


class CounselorAnswer(BaseModel):
    """``CounselorService.respond``'s result: one reply, before it is framed as a completion or chunks."""

    text: str  # the client-facing reply after the safety check
    finish_reason: str  # of the final stage: "stop" | "length" (a remote model may name others)
    usage: Usage
    escrag: EscragInfo


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class Choice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: str
    logprobs: None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage
    escrag: EscragInfo


class Delta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChunkChoice(BaseModel):
    index: int = 0
    delta: Delta
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    escrag: EscragInfo | None = None  # the last chunk only


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    owned_by: str = "escrag"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
