"""RAG inference (Algorithm 1, lines 18-23) as an OpenAI-compatible counselor service.

Owns: ``rag_answer`` (one history -> stage 1 -> retrieve -> stage 2 -> safety check -> answer dict,
also called by the demo job), ``build_app`` (``POST /v1/chat/completions``, ``GET /v1/models``, plus
``escrag.serving.add_common``) and ``main`` for ``escrag serve counselor``.

The reply's ``choices[0].message.content`` is the final response text (the ``<response>`` block of
the stage-2 output; when the output does not parse, its text with the tags removed, or the stage-1
response if that is empty too). A top-level ``escrag`` field carries ``think``, ``initial``,
``exemplars``, ``risk`` ("none" | "elevated" | "high"), ``reasons`` and the raw output. Every reply
passes ``escrag.safety`` (docs/safety.md): at high risk it is a supportive reply that names where
to get help now in ``safety.locale``.

Streaming (``stream: true``) sends the final response text as SSE chunks once both stages are done:
the stage-2 output starts with the think block and must pass the safety check, so nothing can be
sent earlier. The last chunk carries ``finish_reason`` and the ``escrag`` field.
"""

from __future__ import annotations

import json
import re
import time
import uuid

from fastapi import FastAPI
from fastapi.responses import JSONResponse, StreamingResponse

from escrag.config import Config
from escrag.data import DialogueState
from escrag.errors import UserError
from escrag.formats import parse_output, response_text
from escrag.http_client import ServiceError
from escrag.prompts import stage1_messages, stage2_messages
from escrag.safety import RiskClassifier, safety_reply
from rollout.counselor_protocol import ChatCompletionRequest
from rollout.engine import SamplingParams
from rollout.episode import as_scheduler, prompt_ids, retrieval_query, sampling_params

_TAG = re.compile(r"</?(think|response)>")
_CLASSIFIERS: dict[str, RiskClassifier] = {}


def reply_text(output: str, fallback: str = "") -> str:
    """The client-facing text of a policy output (module doc)."""
    parsed = parse_output(output)
    if parsed.ok:
        return parsed.response
    if "<response>" in output:
        output = output.split("<response>", 1)[1].split("</response>", 1)[0]
    return _TAG.sub("", output).strip() or fallback.strip()


def _classifier(cfg: Config) -> RiskClassifier:
    key = repr(cfg.safety)
    if key not in _CLASSIFIERS:
        _CLASSIFIERS[key] = RiskClassifier.from_config(cfg)
    return _CLASSIFIERS[key]


def _history(state_or_history) -> list[dict]:
    history = state_or_history.history if isinstance(state_or_history, DialogueState) else state_or_history
    if not history or history[-1].get("role") != "user":
        raise UserError("history must be non-empty and end with a client ('user') turn")
    return [{"role": m["role"], "content": m["content"]} for m in history]


async def rag_answer(state_or_history, engine, retriever_client, cfg: Config,
                     classifier: RiskClassifier | None = None, params1: SamplingParams | None = None,
                     params2: SamplingParams | None = None) -> dict:
    """Answer one dialogue state. ``retriever_client=None`` gives a one-stage answer (no RAG).
    ``classifier=None`` uses the one ``cfg.safety`` describes (loaded once per process)."""
    history = _history(state_or_history)
    sched, turns = as_scheduler(engine, cfg.rollout.max_batch), cfg.data.max_history_turns
    p1 = prompt_ids(sched.tokenizer, stage1_messages(history, turns))
    (g1,) = await sched.generate([p1], params1 or sampling_params(cfg, 1))
    final, initial, exemplars, prompt_tokens = g1, "", [], len(p1)
    if retriever_client is not None:
        initial = response_text(g1.text)
        (exemplars,) = await retriever_client.retrieve([retrieval_query(g1.text, history)],
                                                       k=cfg.retriever.k)
        p2 = prompt_ids(sched.tokenizer, stage2_messages(history, initial, exemplars, turns))
        (final,) = await sched.generate([p2], params2 or sampling_params(cfg, 2))
        prompt_tokens += len(p2)
    risk = (classifier or _classifier(cfg)).assess(history)
    parsed = parse_output(final.text)
    return {
        "response": safety_reply(reply_text(final.text, fallback=initial), risk, cfg.safety),
        "think": parsed.think if parsed.ok else "",
        "initial": initial,
        "initial_output": g1.text if retriever_client is not None else "",
        "exemplars": exemplars,
        "output": final.text,
        "format_ok": parsed.ok,
        "finish_reason": final.finish_reason,
        **risk.to_dict(),
        "usage": {"prompt_tokens": prompt_tokens,
                  "completion_tokens": len(g1.token_ids) + (len(final.token_ids) if final is not g1 else 0)},
    }


# ---------------------------------------------------------------------------------- the service


def _request_params(req: ChatCompletionRequest, cfg: Config) -> tuple[SamplingParams, SamplingParams]:
    ro = cfg.rollout
    temp = ro.temperature if req.temperature is None else req.temperature
    top_p = ro.top_p if req.top_p is None else req.top_p
    p2_tokens = req.new_tokens() or ro.max_new_tokens_stage2
    p1 = SamplingParams(ro.max_new_tokens_stage1, temp, top_p, ro.top_k, req.seed)
    p2 = SamplingParams(p2_tokens, temp, top_p, ro.top_k, None if req.seed is None else req.seed + 1)
    return p1, p2


def _escrag_field(ans: dict) -> dict:
    keys = ("think", "initial", "exemplars", "risk", "reasons", "categories", "output", "format_ok")
    return {k: ans[k] for k in keys}


def _completion(ans: dict, model: str) -> dict:
    usage = dict(ans["usage"], total_tokens=sum(ans["usage"].values()))
    return {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion",
            "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": ans["response"]},
                         "finish_reason": ans["finish_reason"], "logprobs": None}],
            "usage": usage, "escrag": _escrag_field(ans)}


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
    yield event({}, ans["finish_reason"], escrag=_escrag_field(ans))
    yield "data: [DONE]\n\n"


def build_app(engine, retriever_client, cfg: Config, classifier: RiskClassifier,
              api_key: str | None = None, model_name: str = "escrag-counselor") -> FastAPI:
    """The counselor app; ``retriever_client=None`` answers in one stage (``--no-rag``)."""
    from escrag.serving import add_common

    app = FastAPI(title="escrag counselor")
    app.state.sched = as_scheduler(engine, cfg.rollout.max_batch)
    app.state.cfg, app.state.classifier, app.state.retriever = cfg, classifier, retriever_client
    metrics = add_common(app, "escrag_counselor", api_key=api_key,
                         health=lambda: {"model": model_name, "rag": retriever_client is not None,
                                         "weights_version": engine.version})
    risk_counter = metrics.counter("escrag_counselor_risk", "replies by risk level", ["level"])

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": "escrag"}]}

    @app.post("/v1/chat/completions")
    async def chat(req: ChatCompletionRequest):
        p1, p2 = _request_params(req, cfg)
        try:
            ans = await rag_answer(req.history(), app.state.sched, retriever_client, cfg, classifier,
                                   p1, p2)
        except ServiceError as exc:
            return JSONResponse({"detail": f"retriever unavailable: {exc}"}, status_code=502)
        risk_counter.labels(ans["risk"]).inc()
        if req.stream:
            return StreamingResponse(_sse(ans, model_name), media_type="text/event-stream")
        return _completion(ans, model_name)

    return app


def main(args) -> int:
    """``escrag serve counselor --policy SPEC (--retriever URL | --no-rag)``."""
    import os

    from escrag.config import load_config
    from escrag.serving import serve
    from rollout.engine import make_engine

    cfg = load_config(args.config, args.override)
    if not args.no_rag and not args.retriever:
        raise UserError("--retriever URL is required unless --no-rag is given")
    retriever = None
    if not args.no_rag:
        from retriever_server.client import RetrieverClient

        retriever = RetrieverClient(args.retriever, api_key=os.environ.get("ESCRAG_RETRIEVER_API_KEY"))
    engine = make_engine(cfg, model_spec=args.policy)
    app = build_app(engine, retriever, cfg, RiskClassifier.from_config(cfg), api_key=args.api_key,
                    model_name=args.policy)
    serve(app, args.host, args.port)
    return 0
