"""The counselor's logic: ``CounselorService`` (one history -> safety check -> ``rollout.episode.answer``
-> safety check of the reply -> a typed ``CounselorAnswer``) and ``load_service`` (what ``escrag serve counselor``'s flags
describe). The routes are ``rollout.counselor.server``'s, the schemas ``rollout.counselor.protocol``'s.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os

from escrag.config import Config
from escrag.errors import Overloaded, UserError
from escrag.llm.endpoint import ChatEndpoint
from escrag.safety.classifier import RiskClassifier
from escrag.safety.guard import Guard, combine
from escrag.safety.reply import safety_reply, with_note
from escrag.safety.types import LEVELS, RiskAssessment, with_answer
from rollout.counselor.protocol import ChatCompletionRequest, CounselorAnswer, EscragInfo, Usage
from rollout.engines.base import SamplingParams
from rollout.episode import answer, as_scheduler, engine_chat


class CounselorService:
    """Answers conversations with a local engine (``engine``) or a remote model (``endpoint``)."""

    def __init__(self, cfg: Config, classifier: RiskClassifier, retriever=None, engine=None,
                 endpoint: ChatEndpoint | None = None, guard: Guard | None = None):
        if (engine is None) == (endpoint is None):
            raise UserError("give a local policy or a remote endpoint, not both or neither")
        self.cfg, self.classifier, self.retriever = cfg, classifier, retriever
        self.sched = as_scheduler(engine, cfg.rollout.max_batch) if engine is not None else None
        self.endpoint = endpoint
        self.busy = 0  # requests in progress (counselor.max_queue)
        self.guard = guard if guard is not None else Guard.from_config(cfg.safety)

    def health(self) -> dict:
        version = getattr(getattr(self.sched, "engine", self.sched), "version", None)
        return {"rag": self.retriever is not None, "weights_version": version,
                "endpoint_model": self.endpoint.cfg.model if self.endpoint else None}

    def too_long(self, history: list[dict]) -> str | None:
        """Why the conversation is over ``counselor.max_history_chars``, or None."""
        limit = self.cfg.counselor.max_history_chars
        size = sum(len(m["content"]) for m in history)
        if size > limit:
            return (f"messages: the conversation holds {size} characters, more than this server's "
                    f"limit of {limit} (counselor.max_history_chars)")
        return None

    def tail(self, history: list[dict]) -> list[dict]:
        """The last turns within ``counselor.max_history_chars`` (the last one cut to fit)."""
        room, out = self.cfg.counselor.max_history_chars, []
        for m in reversed(history):
            if room <= 0:
                break
            out.append({**m, "content": m["content"][-room:]})
            room -= len(out[-1]["content"])
        return out[::-1]

    async def respond(self, req: ChatCompletionRequest) -> CounselorAnswer:
        """Safety first: the conversation is assessed before anything is generated, and at high risk
        the answer is the safety reply with no model text anywhere (nothing is generated); otherwise
        the model's reply is assessed too (as one more turn of the conversation), and a high-risk
        reply is replaced the same way; at elevated (conversation or reply) the reply is followed by the
        gentle note of ``safety.elevated_note``. The checks run off the event loop. A conversation past
        ``counselor.max_history_chars`` is checked on its last turns within it, then refused (400) unless
        high; one past the engine's context is refused by ``engine_chat`` (400, vLLM's wording) after the
        check. Beyond ``counselor.max_queue`` requests in progress: 503 with Retry-After."""
        cc = self.cfg.counselor
        if self.busy >= cc.max_queue:
            raise Overloaded(f"counselor overloaded: {self.busy} requests in progress (counselor.max_queue "
                             f"{cc.max_queue}); retry shortly", retry_after=cc.retry_after_s)
        self.busy += 1
        try:
            return await self._respond(req)
        finally:
            self.busy -= 1

    async def _respond(self, req: ChatCompletionRequest) -> CounselorAnswer:
        history = req.history()
        too_long = self.too_long(history)
        risk = await self.assess(self.tail(history) if too_long else history)
        if risk.level == "high":  # a crisis gets help even in a conversation too long to answer
            return self._safety_answer(risk, {})
        if too_long:
            raise UserError(too_long)
        if req.retrieval_k is not None and self.retriever is None:
            raise UserError("retrieval_k: this counselor answers without retrieval (--no-rag)")
        usage: dict = {}
        ans = await answer(history, self._chat(req, usage), self.retriever, self.cfg,
                           rag=self.retriever is not None, k=req.retrieval_k, seed=req.seed)
        after = await self.assess(with_answer(history, ans["response"]))
        if after.level == "high":
            return self._safety_answer(after, usage, "the model's reply read as high risk and was withheld")
        info = EscragInfo(think=ans["think"], initial=ans["initial"], exemplars=ans["exemplars"],
                          output=ans["output"], format_ok=ans["format_ok"], **risk.to_dict())
        level = max(risk, after, key=lambda a: LEVELS.index(a.level))
        return CounselorAnswer(text=with_note(ans["response"], level, self.cfg.safety), finish_reason=usage.get("finish_reason", "stop"),
                               escrag=info, usage=self._usage(usage))

    async def assess(self, history: list[dict]) -> RiskAssessment:
        """The embedded check (off the event loop) and the guard model (``safety.guard``) side by side;
        the higher level wins, and a failed guard leaves the embedded verdict."""
        embedded = asyncio.to_thread(self.classifier.assess, history)
        if self.guard is None:
            return await embedded
        mine, theirs = await asyncio.gather(embedded, self.guard.assess(history))
        return combine(mine, theirs)

    def _safety_answer(self, risk, usage: dict, note: str | None = None) -> CounselorAnswer:
        """The safety reply for ``risk``; the ``escrag`` field carries the assessment and no model text."""
        found = risk.to_dict()
        if note:  # the reasons would quote the withheld reply's words
            found["reasons"] = [note]
        info = EscragInfo(think="", initial="", exemplars=[], output="", format_ok=False, **found)
        return CounselorAnswer(text=safety_reply("", risk, self.cfg.safety), finish_reason="stop", escrag=info,
                               usage=self._usage(usage))

    @staticmethod
    def _usage(usage: dict) -> Usage:
        prompt, completion = usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)
        return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)

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
        """A ``Chat`` over a remote OpenAI-compatible model (``escrag.llm.endpoint``: its concurrency and
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
    from rollout.engines import make_engine

    # oneDNN keeps a primitive per op and shape, 1,024 by default: read when it makes its first (none yet).
    # The engine and the crisis check run their lengths on escrag.shapes.bucket's grid, so 128 hold what
    # a server uses; at the default its memory grew for as long as new shapes came (bench/bench_load.py).
    # The reward server keeps the default: its rows run at their own lengths (reward_server/model.py).
    os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "128")
    engine = make_engine(cfg, model_spec=args.policy)
    classifier = RiskClassifier.from_config(cfg, run=engine.call)  # on the engine's thread
    return CounselorService(cfg, classifier, retriever, engine=engine)
