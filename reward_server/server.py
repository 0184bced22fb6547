"""The reward HTTP service: ``escrag serve reward --rm DIR`` (or ``--rule NAME[:ARG]``).

Owns: ``build_app(service)`` (thin routes over ``RewardService``; auth, size limit, 4xx shapes,
``/health`` and ``/metrics`` from ``escrag.web.serving.add_common``) and the CLI handler ``main``.
Routes: ``POST /score``, ``POST /get_reward``, ``GET /health``, ``GET /metrics``; shapes in
``reward_server.protocol``. A full queue answers 503 with ``Retry-After`` (``escrag.web.serving``).
"""

from __future__ import annotations

from fastapi import FastAPI

from escrag.config import load_config
from escrag.web.serving import add_common, serve
from reward_server.protocol import GetRewardRequest, ScoreRequest, ScoreResponse
from reward_server.service import RewardService


def build_app(service: RewardService, api_key: str | None = None) -> FastAPI:
    app = FastAPI(title="escrag reward server", docs_url=None, redoc_url=None)
    metrics = add_common(app, "escrag_reward", api_key, service.rc.max_body_bytes, health=service.info)
    service.attach_metrics(metrics)
    app.state.service = service

    @app.post("/score", response_model=ScoreResponse)
    async def score(req: ScoreRequest):
        return await service.score([it.model_dump() for it in req.items])

    @app.post("/get_reward")
    async def get_reward(req: GetRewardRequest):
        return await service.get_reward(req.query, req.prompts)

    return app


def load_service(args, cfg) -> RewardService:
    if args.rule:
        return RewardService.from_rule(args.rule, cfg.reward)
    return RewardService.from_rm(args.rm, cfg.reward, getattr(args, "backbone", None))


def main(args) -> int:
    """``escrag serve reward (--rm DIR | --rule NAME[:ARG]) [--port N] [--api-key K]``."""
    cfg = load_config(args.config, args.override)
    service = load_service(args, cfg)
    print(f"reward server: {service.name} on http://{args.host}:{args.port}", flush=True)
    serve(build_app(service, api_key=args.api_key), host=args.host, port=args.port)
    return 0
