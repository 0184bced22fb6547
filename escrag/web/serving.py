"""What every HTTP service of the project shares (design section 3).

Owns: bearer-token auth (compared in constant time), the request-size limit (the header and the
streamed body alike; a refused body is read and discarded first, up to a bound, so that the client
reads its 413 or 401 instead of a reset), refusing bodies that are not UTF-8 and JSON strings that
hold malformed Unicode (lone surrogates, raw or escaped, which would fail deep inside a tokenizer or
an embedder, and then for every request batched with them), the one mapping from the project's
error classes to HTTP answers, ``GET /health`` and ``GET /metrics`` (Prometheus text from a registry
private to each app, so several apps can live in one process), request counters and latency
histograms labelled by route template (an unknown path counts as ``unmatched``, so random paths
cannot grow the metrics), and ``serve()`` which runs uvicorn on 127.0.0.1 unless told otherwise.

What an unauthenticated caller sees: with an API key set, ``/health`` answers only ``{"status":
"ok"}`` (the service's own fields, such as model folders, need the key) and ``/metrics`` aggregate
counters; a 502 names no upstream URL or error (those go to the log).

Errors -> answers, in this one place: ``UserError`` 400, pydantic validation 422, ``Overloaded`` (a
full queue) 503 with ``Retry-After``, ``ServiceError`` (a service this one depends on failed) 502; every
body is JSON ``{"detail": ...}`` and bad input never gets a 500.

Each service keeps the vLLM shape: ``protocol.py`` (pydantic schemas), a logic class, and a
``build_app()`` that calls ``add_common`` and adds thin routes.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import re
import time

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from starlette.routing import Match

from escrag.errors import Overloaded, ServiceError, UserError

DEFAULT_MAX_BODY = 8 * 1024 * 1024
DRAIN_BYTES = 64 * 1024 * 1024  # a refused body is read to its end up to this (twice the limit if larger)
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
OPEN_PATHS = ("/health", "/metrics")
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
UNMATCHED = "unmatched"  # the path label of a request no route matches
log = logging.getLogger("escrag.web")


class AppMetrics:
    """Per-app Prometheus registry with the request metrics every service exports."""

    def __init__(self, prefix: str):
        self.registry = CollectorRegistry()
        self.requests = Counter(f"{prefix}_requests", "HTTP requests", ["path", "status"],
                                registry=self.registry)
        self.latency = Histogram(f"{prefix}_request_seconds", "HTTP request latency", ["path"],
                                 buckets=LATENCY_BUCKETS, registry=self.registry)

    def counter(self, name: str, doc: str, labels=()) -> Counter:
        return Counter(name, doc, list(labels), registry=self.registry)

    def histogram(self, name: str, doc: str, buckets) -> Histogram:
        return Histogram(name, doc, buckets=buckets, registry=self.registry)


def _detail(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors():
        if err.get("type") == "json_invalid":  # loc would read "0: JSON decode error"
            parts.append(f"body: invalid JSON ({(err.get('ctx') or {}).get('error', 'cannot decode')})")
            continue
        loc = ".".join(str(x) for x in err.get("loc", ()) if x != "body")
        parts.append(f"{loc or 'body'}: {err.get('msg', 'invalid')}")
    return "; ".join(parts) or "invalid request"


def malformed_unicode(body: bytes) -> str | None:
    """Where a JSON body is not UTF-8 (raw surrogate bytes included: ``json.loads`` would accept them)
    or holds a string with an escaped lone surrogate; None when it is clean. Only bodies with a
    surrogate escape are parsed, so ordinary requests pay one decode and one regex scan."""
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"body: not valid UTF-8 at byte {exc.start}"
    if not _SURROGATE_ESCAPE.search(body):
        return None
    try:
        data = json.loads(body)
    except RecursionError:
        return "body: JSON nested too deeply"
    except ValueError:
        return None  # not JSON: the route's own validation answers
    stack = [("body", data)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return f"{where}: string holds malformed Unicode (a lone surrogate)"
        elif isinstance(value, dict):
            stack += [(f"{where}.{k}", v) for k, v in value.items()]
        elif isinstance(value, list):
            stack += [(f"{where}[{i}]", v) for i, v in enumerate(value)]
    return None


class Guard:
    """ASGI middleware in front of every route: auth, body size, malformed Unicode, metrics."""

    def __init__(self, app, metrics: AppMetrics, api_key: str | None, max_body_bytes: int, router):
        self.app, self.metrics, self.api_key, self.max_body = app, metrics, api_key, max_body_bytes
        self.drain_bytes = max(DRAIN_BYTES, 2 * max_body_bytes)  # read and discarded before a refusal
        self.router = router  # the app's routes: a request is counted under its route's template

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start, path, status = time.perf_counter(), self._label(scope), {}

        async def counted_send(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            refusal, receive = await self._check(scope, receive)
            await (refusal or self.app)(scope, receive, counted_send)
        finally:
            self.metrics.requests.labels(path, str(status.get("code", 500))).inc()
            self.metrics.latency.labels(path).observe(time.perf_counter() - start)

    def _label(self, scope) -> str:
        """The template of the route ``scope`` asks for (``/v1/chat/completions``), else ``UNMATCHED``."""
        for route in self.router.routes:
            if route.matches(scope)[0] != Match.NONE:
                return getattr(route, "path", UNMATCHED)
        return UNMATCHED

    async def _check(self, scope, receive):
        """(a JSONResponse refusing the request, or None; the receive channel to pass on).

        A refusal goes out only after the whole body is read (discarded), up to ``drain_bytes``: a
        server that answers while its client still sends, then closes (``Connection: close``, or a
        client that asked for it), resets the connection and the client never reads its answer. A body
        past that bound, or one the client waits to send (``Expect: 100-continue``), is answered at
        once with ``Connection: close``; uvicorn closes only after the answer is written."""
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        scope.setdefault("state", {})["authorized"] = authorized(headers, self.api_key)
        size = headers.get("content-length", "")
        too_big = bool(size) and (not size.isdigit() or int(size) > self.max_body)
        if too_big and (not size.isdigit() or int(size) > self.drain_bytes
                        or "100-continue" in headers.get("expect", "").lower()):
            return self._too_big(close=True), receive
        if not scope["state"]["authorized"] and scope["path"] not in OPEN_PATHS:
            _, whole = await self._read(receive, 0)
            return _refuse(401, "missing or wrong bearer token", close=not whole), receive
        body, whole = await self._read(receive, self.max_body)
        if too_big or body is None:
            return self._too_big(close=not whole), receive
        problem = malformed_unicode(body) if body else None
        return (_refuse(400, problem) if problem else None), _replay(body, receive)

    async def _read(self, receive, keep: int) -> tuple[bytes | None, bool]:
        """Read the request body to its end, keeping at most ``keep`` bytes: (the body, or None when it
        is longer; False when reading stopped at ``drain_bytes`` with more to come)."""
        body, seen = bytearray(), 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return (bytes(body) if seen <= keep else None), True
            chunk = message.get("body", b"")
            seen += len(chunk)
            if seen <= keep:
                body += chunk
            if not message.get("more_body"):
                return (bytes(body) if seen <= keep else None), True
            if seen > self.drain_bytes:
                return None, False

    def _too_big(self, close: bool) -> JSONResponse:
        return _refuse(413, f"request body larger than {self.max_body} bytes", close=close)


def authorized(headers: dict, api_key: str | None) -> bool:
    """No key configured, or ``Authorization: Bearer <key>`` (compared in constant time)."""
    if not api_key:
        return True
    return hmac.compare_digest(headers.get("authorization", "").encode(), f"Bearer {api_key}".encode())


def _refuse(status: int, detail: str, close: bool = False) -> JSONResponse:
    return JSONResponse({"detail": detail}, status_code=status, headers={"connection": "close"} if close else None)


def _replay(body: bytes, receive):
    """The body once, then the real channel (a streaming response listens on it for a disconnect)."""
    sent = False

    async def replay():
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


def add_common(app: FastAPI, prefix: str, api_key: str | None = None,
               max_body_bytes: int = DEFAULT_MAX_BODY, health=None) -> AppMetrics:
    """Install the guard, the error answers, /health and /metrics on ``app``; return its metrics.

    ``health`` is an optional callable returning extra fields for ``GET /health``.
    """
    api_key = api_key or os.environ.get("ESCRAG_API_KEY") or None
    metrics = AppMetrics(prefix)
    app.state.metrics = metrics
    app.add_middleware(Guard, metrics=metrics, api_key=api_key, max_body_bytes=max_body_bytes, router=app.router)

    @app.exception_handler(RequestValidationError)
    async def bad_request(_: Request, exc: RequestValidationError):
        return _refuse(422, _detail(exc))

    @app.exception_handler(UserError)
    async def user_error(_: Request, exc: UserError):
        return _refuse(400, str(exc))

    @app.exception_handler(Overloaded)
    async def overloaded(_: Request, exc: Overloaded):
        return JSONResponse({"detail": str(exc)}, status_code=503,
                            headers={"Retry-After": str(exc.retry_after)})

    @app.exception_handler(ServiceError)
    async def upstream(request: Request, exc: ServiceError):
        log.warning("%s %s: upstream failure: %s", request.method, request.url.path, exc)
        return _refuse(502, "a service this one depends on failed; the server log has the details")

    @app.get("/health")
    async def health_route(request: Request):
        details = health() if health and request.scope.get("state", {}).get("authorized", True) else {}
        return {"status": "ok", **details}

    @app.get("/metrics")
    async def metrics_route():
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return metrics


def serve(app: FastAPI, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info") -> None:
    """Run ``app`` with uvicorn until interrupted."""
    import uvicorn

    uvicorn.run(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5)
