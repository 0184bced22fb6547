"""RAG inference (Algorithm 1, lines 18-23) as an OpenAI-compatible counselor service.

Owns: ``CounselorService`` (one history -> ``rollout.episode.answer`` -> safety check -> the reply),
``build_app`` (``POST /v1/chat/completions``, ``GET /v1/models``, plus ``escrag.serving.add_common``)
and ``main`` for ``escrag serve counselor``. The two-stage path is the episode module's; this module
only chooses what generates: a local policy (``--policy SPEC``) through its engine, or any remote
OpenAI-compatible model (``--endpoint URL --endpoint-model NAME``), so a baseline such as GPT-4o gets
the project's retriever exactly as the trained policy does.

The reply's ``choices[0].message.content`` is the final response text (``escrag.formats.reply_text``
of the final output, or the stage-1 response when that is empty). A top-level ``escrag`` field carries
``think``, ``initial``, ``exemplars``, ``risk`` ("none" | "elevated" | "high"), ``reasons``,
``categories``, the raw ``output`` and ``format_ok``. Every reply passes ``escrag.safety`` over the
whole conversation (docs/safety.md): at high risk it is a supportive reply that names where to get
help now in ``safety.locale``.

Streaming (``stream: true``) sends the final response text as SSE chunks once both stages are done:
the final output starts with the think block and must pass the safety check, so nothing can be sent
earlier. The last chunk carries ``finish_reason`` and the ``escrag`` field.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
import uuid

from fastapi import FastAPI
from fastapi.responses import StreamingResponse

from escrag.config import Config
from escrag.endpoints import ChatEndpoint
from escrag.errors import UserError
from escrag.safety import RiskClassifier, safety_reply
from rollout.counselor_protocol import ChatCompletionRequest
from rollout.engine import SamplingParams
from rollout.episode import answer, as_scheduler, engine_chat

ESCRAG_FIELDS = ("think", "initial", "exemplars", "risk", "reasons", "categories", "output", "format_ok")


class CounselorService:
    """Answers conversations with a local engine (``engine``) or a remote model (``endpoint``)."""

    def __init__(self, cfg: Config, classifier: RiskClassifier, retriever=None, engine=None,
                 endpoint: ChatEndpoint | None = None):
        if (engine is None) == (endpoint is None):
            raise UserError("give a local policy or a remote endpoint, not both or neither")
        self.cfg, self.classifier, self.retriever = cfg, classifier, retriever
        self.sched = as_scheduler(engine, cfg.rollout.max_batch) if engine is not None else None
        self.endpoint = endpoint

    def health(self) -> dict:
        version = getattr(getattr(self.sched, "engine", self.sched), "version", None)
        return {"rag": self.retriever is not None, "weights_version": version,
                "endpoint_model": self.endpoint.cfg.model if self.endpoint else None}

    def check(self, history: list[dict]) -> None:
        limit = self.cfg.counselor.max_history_chars
        size = sum(len(m["content"]) for m in history)
        if size > limit:
            raise UserError(f"messages: the conversation holds {size} characters, more than this server's "
                            f"limit of {limit} (counselor.max_history_chars)")

    async def respond(self, req: ChatCompletionRequest) -> dict:
        history = req.history()
        self.check(history)
        usage: dict = {}
        ans = await answer(history, self._chat(req, usage), self.retriever, self.cfg,
                           rag=self.retriever is not None, seed=req.seed)
        risk = self.classifier.assess(history)
        ans.update(risk.to_dict(), response=safety_reply(ans["response"], risk, self.cfg.safety),
                   finish_reason=usage.pop("finish_reason", "stop"))
        ans["usage"] = {"prompt_tokens": usage.get("prompt_tokens", 0),
                        "completion_tokens": usage.get("completion_tokens", 0)}
        return ans

    def _chat(self, req: ChatCompletionRequest, usage: dict):
        """The chat function for one request; ``max_tokens`` caps the final answer: stage 2 with RAG,
        the only stage without it."""
        ro = self.cfg.rollout
        changes = {"temperature": req.temperature, "top_p": req.top_p}
        final = 2 if self.retriever is not None else 1
        params = {s: SamplingParams.from_config(ro, s, **changes,
                                                max_new_tokens=req.new_tokens() if s == final else None)
                  for s in (1, 2)}
        if self.sched is not None:
            return engine_chat(self.sched, self.cfg, params, usage)
        return self._endpoint_chat(params, usage)

    def _endpoint_chat(self, params: dict[int, SamplingParams], usage: dict):
        """A ``Chat`` over a remote OpenAI-compatible model (``escrag.endpoints``: its concurrency and
        rate limits, retries and accounting). No ``stop`` is sent: such servers drop the stop sequence
        from the text, which would cut ``</response>`` off the format."""
        async def chat(messages: list[dict], stage: int, seed: int | None) -> str:
            p = params[stage]
            result = await self.endpoint.chat(messages, temperature=p.temperature, top_p=p.top_p,
                                              max_tokens=p.max_new_tokens, seed=seed, tag=f"stage{stage}")
            usage["prompt_tokens"] = usage.get("prompt_tokens", 0) + result.prompt_tokens
            usage["completion_tokens"] = usage.get("completion_tokens", 0) + result.completion_tokens
            usage["finish_reason"] = result.raw["choices"][0].get("finish_reason") or "stop"
            return result.text

        return chat


# ---------------------------------------------------------------------------------- the app


def _completion(ans: dict, model: str) -> dict:
    usage = dict(ans["usage"], total_tokens=sum(ans["usage"].values()))
    return {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion",
            "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": ans["response"]},
                         "finish_reason": ans["finish_reason"], "logprobs": None}],
            "usage": usage, "escrag": {k: ans[k] for k in ESCRAG_FIELDS}}


def _sse(ans: dict, model: str):
    """The final text as OpenAI ``chat.completion.chunk`` events, then ``[DONE]``."""
    base = {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion.chunk",
            "created": int(time.time()), "model": model}

    def event(delta: dict, finish=None, **extra) -> str:
        chunk = {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}
        return f"data: {json.dumps(chunk)}\n\n"

    yield event({"role": "assistant", "content": ""})
    for piece in re.findall(r"\s*\S+", ans["response"]):
        yield event({"content": piece})
    yield event({}, ans["finish_reason"], escrag={k: ans[k] for k in ESCRAG_FIELDS})
    yield "data: [DONE]\n\n"


def build_app(service: CounselorService, api_key: str | None = None,
              model_name: str = "escrag-counselor") -> FastAPI:
    from escrag.serving import add_common

    app = FastAPI(title="escrag counselor", docs_url=None, redoc_url=None)
    app.state.service = service
    metrics = add_common(app, "escrag_counselor", api_key=api_key,
                         max_body_bytes=service.cfg.counselor.max_body_bytes,
                         health=lambda: {"model": model_name, **service.health()})
    risk_counter = metrics.counter("escrag_counselor_risk", "replies by risk level", ["level"])

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": "escrag"}]}

    @app.post("/v1/chat/completions")
    async def chat(req: ChatCompletionRequest):
        ans = await service.respond(req)
        risk_counter.labels(ans["risk"]).inc()
        if req.stream:
            return StreamingResponse(_sse(ans, model_name), media_type="text/event-stream")
        return _completion(ans, model_name)

    return app


def load_service(args, cfg: Config) -> CounselorService:
    """The service ``escrag serve counselor`` describes (flags checked before any model loads)."""
    if not args.no_rag and not args.retriever:
        raise UserError("--retriever URL is required unless --no-rag is given")
    if (args.policy is None) == (args.endpoint is None):
        raise UserError("give exactly one of --policy SPEC and --endpoint URL")
    if args.endpoint and not args.endpoint_model:
        raise UserError("--endpoint needs --endpoint-model NAME")
    retriever = None
    if not args.no_rag:
        from retriever_server.client import RetrieverClient

        retriever = RetrieverClient(args.retriever, cfg.retriever)
    if args.endpoint:
        ecfg = dataclasses.replace(cfg.counselor.endpoint, base_url=args.endpoint, model=args.endpoint_model,
                                   api_key_env=args.endpoint_key_env)
        return CounselorService(cfg, RiskClassifier.from_config(cfg), retriever,
                                endpoint=ChatEndpoint("counselor", ecfg))
    from rollout.engine import make_engine

    engine = make_engine(cfg, model_spec=args.policy)
    classifier = RiskClassifier.from_config(cfg, run=engine.call)  # on the engine's thread
    return CounselorService(cfg, classifier, retriever, engine=engine)


def main(args) -> int:
    """``escrag serve counselor (--policy SPEC | --endpoint URL ...) (--retriever URL | --no-rag)``."""
    from escrag.config import load_config
    from escrag.serving import serve

    cfg = load_config(args.config, args.override)
    service = load_service(args, cfg)
    name = args.policy or args.endpoint_model
    serve(build_app(service, api_key=args.api_key, model_name=name), args.host, args.port)
    return 0
