"""The retriever HTTP service: ``escrag serve retriever --index DIR``.

Owns: ``build_app(service, ...)`` (thin routes over ``RetrieverService``, the shared guard of
``escrag.web.serving``: auth, body limit, 4xx JSON errors, ``/health``, ``/metrics``) and the command
handler ``main(args)``, which checks the index's manifest against the embedder before loading any
model, so that a mismatch fails in a second with a clear message.

Metrics (Prometheus, ``GET /metrics``): ``retriever_requests`` and ``retriever_request_seconds``
(shared), ``retriever_batch_size`` (queries per embedding batch) and ``retriever_queries``.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from escrag.config import load_config
from escrag.web.serving import add_common, serve
from retriever_server.protocol import RetrieveRequest, RetrieveResponse
from retriever_server.service import RetrieverService

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 48, 64, 128, 256)


def build_app(service: RetrieverService, api_key: str | None = None) -> FastAPI:
    """The FastAPI app over ``service`` (state: ``app.state.service``, ``app.state.metrics``)."""
    app = FastAPI(title="escrag retriever", docs_url=None, redoc_url=None)
    app.state.service = service
    metrics = add_common(app, "retriever", api_key, service.rc.max_body_bytes, health=service.health)
    batch_sizes = metrics.histogram("retriever_batch_size", "queries per embedding batch", BATCH_BUCKETS)
    queries = metrics.counter("retriever_queries", "queries answered")
    service.batcher.on_batch = batch_sizes.observe

    @app.post("/retrieve")
    async def retrieve(req: RetrieveRequest):
        results = await service.retrieve(req.queries, req.k, req.return_scores, req.exclude_dialogue_ids)
        queries.inc(len(req.queries))
        return JSONResponse(RetrieveResponse(results=results).model_dump(exclude_none=True))

    return app


def load_service(index: str, embedder: str | None, cfg) -> RetrieverService:
    """Check the manifest, then load the embedder and the index (the slow part)."""
    from escrag.embed import load_embedder
    from retriever_server.index import check_embedder, load_index, read_manifest

    spec = embedder or cfg.retriever.embedder
    check_embedder(index, read_manifest(index), spec)
    vector_index = load_index(index, spec, cfg.retriever)
    return RetrieverService(vector_index, load_embedder(spec, cfg.retriever.device), cfg.retriever)


def main(args) -> int:
    """Handler of ``escrag serve retriever``."""
    cfg = load_config(args.config, args.override)
    service = load_service(args.index, args.embedder, cfg)
    print(f"retriever: {service.index.count} chunks ({service.embedder.name}) on http://{args.host}:{args.port}",
          flush=True)
    serve(build_app(service, api_key=args.api_key), host=args.host, port=args.port)
    return 0
