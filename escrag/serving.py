"""What every HTTP service of the project shares (design section 3).

Owns: bearer-token auth, the request-size limit, turning bad input into a 4xx with a JSON
``{"detail": ...}`` (never a 500), ``GET /health`` and ``GET /metrics`` (Prometheus text from a
registry private to each app, so several apps can live in one process), request counters and latency
histograms, and ``serve()`` which runs uvicorn on 127.0.0.1 unless told otherwise.

Each service keeps the vLLM shape: ``protocol.py`` (pydantic schemas), a logic class, and a
``build_app()`` that calls ``add_common`` and adds thin routes.
"""

from __future__ import annotations

import os
import time

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest

from escrag.errors import UserError

DEFAULT_MAX_BODY = 8 * 1024 * 1024
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
OPEN_PATHS = ("/health", "/metrics")


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


def add_common(app: FastAPI, prefix: str, api_key: str | None = None,
               max_body_bytes: int = DEFAULT_MAX_BODY, health=None) -> AppMetrics:
    """Install auth, size limit, error shapes, /health and /metrics on ``app``; return its metrics.

    ``health`` is an optional callable returning extra fields for ``GET /health``.
    """
    api_key = api_key or os.environ.get("ESCRAG_API_KEY") or None
    metrics = AppMetrics(prefix)
    app.state.metrics = metrics

    @app.middleware("http")
    async def guard(request: Request, call_next):
        start = time.perf_counter()
        path = request.url.path
        if api_key and path not in OPEN_PATHS:
            if request.headers.get("authorization", "") != f"Bearer {api_key}":
                return _count(metrics, path, start, JSONResponse(
                    {"detail": "missing or wrong bearer token"}, status_code=401))
        size = request.headers.get("content-length")
        if size is not None and (not size.isdigit() or int(size) > max_body_bytes):
            return _count(metrics, path, start, JSONResponse(
                {"detail": f"request body larger than {max_body_bytes} bytes"}, status_code=413))
        response = await call_next(request)
        return _count(metrics, path, start, response)

    @app.exception_handler(RequestValidationError)
    async def bad_request(_: Request, exc: RequestValidationError):
        return JSONResponse({"detail": _detail(exc)}, status_code=422)

    @app.exception_handler(UserError)
    async def user_error(_: Request, exc: UserError):
        return JSONResponse({"detail": str(exc)}, status_code=400)

    @app.get("/health")
    async def health_route():
        return {"status": "ok", **(health() if health else {})}

    @app.get("/metrics")
    async def metrics_route():
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return metrics


def _count(metrics: AppMetrics, path: str, start: float, response):
    metrics.requests.labels(path, str(response.status_code)).inc()
    metrics.latency.labels(path).observe(time.perf_counter() - start)
    return response


def serve(app: FastAPI, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info") -> None:
    """Run ``app`` with uvicorn until interrupted."""
    import uvicorn

    uvicorn.run(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5)
