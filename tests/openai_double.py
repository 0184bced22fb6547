"""A scripted OpenAI-compatible chat server for tests: a real HTTP server on a loopback port.

The only test double the house allows is one for an outside paid service, and then as a real server
speaking its protocol. This is that server for every LLM API the project calls (the judge, baseline
systems, preference construction). It runs uvicorn in a thread of the test process, so a test can
read its call counts directly while the code under test reaches it over a socket (from this process
or from a child process). Nothing here is imported by the project itself.

    with OpenAIDouble() as llm:                       # llm.base_url == "http://127.0.0.1:PORT/v1"
        llm.on("s3", r"I lost my job", [Reply.error(429, retry_after=1)], default=Reply.json(SCORES))
        llm.on("any", r".", default=Reply(content="<think>t</think><response>r</response>"))
        ... run the code under test against llm.base_url ...
        assert llm.calls["s3"] == 2

Script: ``on(key, pattern, replies, default, match)`` adds a rule. A request is matched against the
rules in the order they were added: ``pattern`` (a regex, ``re.search``) against the text of all its
messages joined by newlines (``match="all"``) or of its last message only (``match="last"``). The
first rule that matches answers with the next reply of its queue, then with ``default`` once the queue
is empty; a rule with neither, or a request no rule matches (and no ``fallback``), gets HTTP 400 with
a detail saying so, which the client does not retry, so a gap in a script fails a test loudly.

A ``Reply`` is a normal answer (``content``: text, or a function of the request body), an error
status (``Reply.error(429, retry_after=1)``, ``Reply.error(500)``), a delay before answering
(``delay_s``, e.g. longer than the client's timeout), or any mix. ``usage`` defaults to word counts.

Counts: ``calls[key]`` (every request the rule answered, errors included), ``total``, ``requests``
(a ``Call`` per request: key, body, arrival time, in arrival order) and ``max_in_flight`` (the most
requests handled at once). ``reset()`` clears them.

Moderations: ``moderate(scores, replies)`` serves ``POST /v1/moderations`` in OpenAI's shape
(``results[0].flagged / categories / category_scores``): ``scores`` maps the input text to category
scores; ``replies`` (e.g. ``Reply.error(500)``, ``Reply(delay_s=5)``) answer first. Counted as ``calls["moderations"]``.

``keyword_guard()`` (and ``python tests/openai_double.py --keyword-guard --port N``) is a guard model
double: a few keyword patterns answered as Llama Guard answers ("safe" / "unsafe\nS11") on chat and as
moderation scores on /v1/moderations. It is a TEST DOUBLE, not a guard: numbers measured with it say
that the combination works, not how a real guard model reads crises.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from escrag.web.procs import free_port


class _AsciiJSON(JSONResponse):
    def render(self, content) -> bytes:
        return json.dumps(content).encode("ascii")


@dataclass
class Reply:
    content: str | Callable[[dict], str] = ""  # assistant text, or a function of the request body
    status: int = 200
    retry_after: float | None = None  # Retry-After header (seconds) on an error status
    delay_s: float = 0.0  # wait this long before answering
    usage: dict | None = None  # None: word counts of the request and the content
    extra: dict = field(default_factory=dict)  # more top-level fields of the response body

    @classmethod
    def json(cls, obj, **kw) -> Reply:
        return cls(content=json.dumps(obj), **kw)

    @classmethod
    def error(cls, status: int, retry_after: float | None = None, **kw) -> Reply:
        return cls(status=status, retry_after=retry_after, **kw)


@dataclass
class Call:
    key: str  # the rule that answered ("<unmatched>" when none did)
    body: dict  # the request body
    at: float  # arrival, time.monotonic()


@dataclass
class Rule:
    key: str
    pattern: re.Pattern
    queue: deque
    default: Reply | None
    match: str  # "all" or "last"


def _text(body: dict, which: str) -> str:
    msgs = body.get("messages") or []
    if which == "last":
        msgs = msgs[-1:]
    parts = []
    for m in msgs:
        c = m.get("content", "")
        parts.append(c if isinstance(c, str) else "".join(p.get("text", "") for p in c))
    return "\n".join(parts)


class OpenAIDouble:
    def __init__(self, fallback: Reply | None = None):
        self.rules: list[Rule] = []
        self.fallback = fallback
        self.calls: Counter = Counter()
        self.requests: list[Call] = []
        self.in_flight = self.max_in_flight = 0
        self._lock = threading.Lock()
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self._server = None
        self._thread = None
        self._scores: Callable[[str], dict] | None = None
        self._moderation_queue: deque = deque()

    def moderate(self, scores: Callable[[str], dict], replies=()) -> OpenAIDouble:
        self._scores, self._moderation_queue = scores, deque(replies)
        return self

    # ------------------------------------------------------------------ script
    def on(self, key: str, pattern: str, replies=(), default: Reply | None = None,
           match: str = "all") -> OpenAIDouble:
        if match not in ("all", "last"):
            raise ValueError("match must be 'all' or 'last'")
        self.rules.append(Rule(key, re.compile(pattern), deque(replies), default, match))
        return self

    def reset(self) -> None:
        with self._lock:
            self.calls.clear()
            self.requests.clear()
            self.max_in_flight = 0

    @property
    def total(self) -> int:
        return sum(self.calls.values())

    def _pick(self, body: dict) -> tuple[str, Reply | None]:
        with self._lock:
            for rule in self.rules:
                if rule.pattern.search(_text(body, rule.match)):
                    reply = rule.queue.popleft() if rule.queue else rule.default
                    self.calls[rule.key] += 1
                    self.requests.append(Call(rule.key, body, time.monotonic()))
                    return rule.key, reply
            self.calls["<unmatched>"] += 1
            self.requests.append(Call("<unmatched>", body, time.monotonic()))
            return "<unmatched>", self.fallback

    # ------------------------------------------------------------------ protocol
    def _answer(self, body: dict, reply: Reply) -> JSONResponse:
        if reply.status >= 400:
            headers = {} if reply.retry_after is None else {"Retry-After": str(reply.retry_after)}
            return JSONResponse({"error": {"message": f"scripted HTTP {reply.status}", "type": "scripted"}},
                                status_code=reply.status, headers=headers)
        content = reply.content(body) if callable(reply.content) else reply.content
        usage = reply.usage or {"prompt_tokens": len(_text(body, "all").split()),
                                "completion_tokens": len(content.split())}
        usage = {**usage, "total_tokens": usage["prompt_tokens"] + usage["completion_tokens"]}
        return _AsciiJSON({  # escaped like a real provider's JSON, so a lone surrogate can be sent
            "id": f"chatcmpl-{uuid.uuid4().hex[:16]}", "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model", "double"),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                         "finish_reason": "stop", "logprobs": None}],
            "usage": usage, **reply.extra})

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def chat(request: Request):
            try:
                body = await request.json()
            except ValueError:
                return JSONResponse({"error": {"message": "body is not JSON"}}, status_code=400)
            key, reply = self._pick(body)
            if reply is None:
                return JSONResponse({"error": {"message": f"script has no reply for rule {key!r}"}},
                                    status_code=400)
            with self._lock:
                self.in_flight += 1
                self.max_in_flight = max(self.max_in_flight, self.in_flight)
            try:
                if reply.delay_s:
                    await asyncio.sleep(reply.delay_s)
                return self._answer(body, reply)
            finally:
                with self._lock:
                    self.in_flight -= 1

        @app.post("/v1/moderations")
        async def moderations(request: Request):
            body = await request.json()
            with self._lock:
                self.calls["moderations"] += 1
                self.requests.append(Call("moderations", body, time.monotonic()))
                reply = self._moderation_queue.popleft() if self._moderation_queue else None
            if self._scores is None:
                return JSONResponse({"error": {"message": "no moderation script"}}, status_code=400)
            if reply is not None:
                await asyncio.sleep(reply.delay_s)
                if reply.status >= 400:
                    return self._answer(body, reply)
            scores = {k: float(v) for k, v in self._scores(str(body.get("input", ""))).items()}
            return {"id": f"modr-{uuid.uuid4().hex[:16]}", "model": body.get("model", "double"),
                    "results": [{"flagged": any(v >= 0.5 for v in scores.values()),
                                 "categories": {k: v >= 0.5 for k, v in scores.items()},
                                 "category_scores": scores}]}

        @app.get("/v1/models")
        async def models():
            return {"object": "list", "data": [{"id": "double", "object": "model"}]}

        return app

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> OpenAIDouble:
        config = uvicorn.Config(self.app(), host="127.0.0.1", port=self.port, log_level="warning",
                                timeout_graceful_shutdown=1)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        deadline = time.time() + 30
        while not self._server.started:
            if time.time() > deadline or not self._thread.is_alive():
                raise RuntimeError("OpenAI double did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            self._thread.join(10)
            self._server = None

    def __enter__(self) -> OpenAIDouble:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# ---------------------------------------------------------------------- the keyword guard (a test double)

GUARD_KEYWORDS = {  # Llama Guard hazard -> (moderation categories, a few patterns)
    "S11": (("self-harm", "self-harm/intent"),
            r"\b(kill(ing)? myself|end (it all|my life)|suicid\w*|better off without me|cut(ting)? myself|"
            r"overdose|want to die|don'?t want to (be here|live))\b"),
    "S1": (("violence",), r"\b(kill (him|her|them)|hurt (him|her|them)|(knife|gun)\b.*\b(use|shoot|stab))"),
}


def keyword_scores(text: str) -> dict:
    scores = {c: 0.01 for cats, _ in GUARD_KEYWORDS.values() for c in cats}
    for cats, pattern in GUARD_KEYWORDS.values():
        if re.search(pattern, text, re.I):
            scores.update({c: 0.9 for c in cats})
    return scores


def _llama_guard_answer(body: dict) -> str:
    text = "\n".join(m.get("content", "") for m in body.get("messages", []) if m.get("role") == "user")
    codes = [code for code, (_, pattern) in GUARD_KEYWORDS.items() if re.search(pattern, text, re.I)]
    return "unsafe\n" + ",".join(codes) if codes else "safe"


def keyword_guard() -> OpenAIDouble:
    """A guard double: Llama Guard's answers on chat, moderation scores on /v1/moderations, by keywords."""
    return OpenAIDouble().on("guard", r"(?s).", default=Reply(content=_llama_guard_answer)).moderate(keyword_scores)


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="serve a test double (tests/openai_double.py)")
    ap.add_argument("--keyword-guard", action="store_true", required=True, help="the keyword guard double")
    ap.add_argument("--port", type=int, default=None)
    a = ap.parse_args()
    double = keyword_guard()
    if a.port:
        double.port, double.base_url = a.port, f"http://127.0.0.1:{a.port}/v1"
    uvicorn.run(double.app(), host="127.0.0.1", port=double.port, log_level="warning")
