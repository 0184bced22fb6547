"""RAG inference (Algorithm 1, lines 18-23) as an OpenAI-compatible counselor service.

Owns: ``build_app`` (``POST /v1/chat/completions``, ``GET /v1/models``, plus ``escrag.web.serving.add_common``)
and ``main`` for ``escrag serve counselor``; the logic is ``rollout.counselor.service``'s. The two-stage
path is the episode module's; the service only chooses what generates: a local policy (``--policy SPEC``) through its engine, or any remote
OpenAI-compatible model (``--endpoint URL --endpoint-model NAME``), so a baseline such as GPT-4o gets
the project's retriever exactly as the trained policy does.

The reply's ``choices[0].message.content`` is the final response text (``escrag.formats.reply_text``
of the final output, or the stage-1 response when that is empty). A top-level ``escrag`` field carries
``think``, ``initial``, ``exemplars``, ``risk`` ("none" | "elevated" | "high"), ``reasons``,
``categories``, the raw ``output`` and ``format_ok``. Safety comes first (``rollout.counselor.service``):
the conversation is assessed before anything is generated, and at high risk the reply is a supportive
one that names where to get help now in ``safety.locale``, with no model text anywhere; the model's
reply is assessed too and withheld the same way when it reads as high risk (docs/safety.md).

Streaming (``stream: true``) sends the final response text as SSE chunks once both stages are done:
the final output starts with the think block and must pass the safety check, so nothing can be sent
earlier. The last chunk carries ``finish_reason`` and the ``escrag`` field.
"""

from __future__ import annotations

import json
import re
import time
import uuid

from fastapi import FastAPI
from fastapi.responses import StreamingResponse

from rollout.counselor.protocol import (
    AssistantMessage,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    Choice,
    ChunkChoice,
    CounselorAnswer,
    Delta,
    ModelCard,
    ModelList,
)
from rollout.counselor.service import CounselorService, load_service

# ---------------------------------------------------------------------------------- the app


def _completion(ans: CounselorAnswer, model: str) -> ChatCompletionResponse:
    choice = Choice(message=AssistantMessage(content=ans.text), finish_reason=ans.finish_reason)
    return ChatCompletionResponse(id=f"chatcmpl-{uuid.uuid4().hex[:24]}", created=int(time.time()), model=model,
                                  choices=[choice], usage=ans.usage, escrag=ans.escrag)


def _sse(ans: CounselorAnswer, model: str):
    """The final text as OpenAI ``chat.completion.chunk`` events, then ``[DONE]``. Every field a chunk
    sends is set explicitly: it is dumped with ``exclude_unset``."""
    base = {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion.chunk",
            "created": int(time.time()), "model": model}

    def event(delta: Delta, finish=None, **extra) -> str:
        chunk = ChatCompletionChunk(**base, choices=[ChunkChoice(index=0, delta=delta, finish_reason=finish)],
                                    **extra)
        return f"data: {json.dumps(chunk.model_dump(mode='json', exclude_unset=True))}\n\n"

    yield event(Delta(role="assistant", content=""))
    for piece in re.findall(r"\s*\S+", ans.text):
        yield event(Delta(content=piece))
    yield event(Delta(), ans.finish_reason, escrag=ans.escrag)
    yield "data: [DONE]\n\n"


def build_app(service: CounselorService, api_key: str | None = None,
              model_name: str = "escrag-counselor") -> FastAPI:
    from escrag.web.serving import add_common

    app = FastAPI(title="escrag counselor", docs_url=None, redoc_url=None)
    app.state.service = service
    metrics = add_common(app, "escrag_counselor", api_key=api_key,
                         max_body_bytes=service.cfg.counselor.max_body_bytes,
                         health=lambda: {"model": model_name, **service.health()})
    risk_counter = metrics.counter("escrag_counselor_risk", "replies by risk level", ["level"])
    if service.guard is not None:
        failed = metrics.counter("escrag_counselor_guard_failures", "guard calls that failed (embedded verdict kept)",
                                 ["kind"])
        service.guard.on_failure = lambda kind: failed.labels(kind).inc()

    @app.get("/v1/models", response_model=ModelList)
    async def models():
        return ModelList(data=[ModelCard(id=model_name)])

    @app.post("/v1/chat/completions", response_model=ChatCompletionResponse)
    async def chat(req: ChatCompletionRequest):
        ans = await service.respond(req)
        risk_counter.labels(ans.escrag.risk).inc()
        if req.stream:  # ChatCompletionChunk events
            return StreamingResponse(_sse(ans, model_name), media_type="text/event-stream")
        return _completion(ans, model_name)

    return app


def main(args) -> int:
    """``escrag serve counselor (--policy SPEC | --endpoint URL ...) (--retriever URL | --no-rag)``."""
    from escrag.config import load_config
    from escrag.web.serving import serve

    cfg = load_config(args.config, args.override)
    service = load_service(args, cfg)
    name = args.policy or args.endpoint_model
    serve(build_app(service, api_key=args.api_key, model_name=name), args.host, args.port)
    return 0
