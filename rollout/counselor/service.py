"""The counselor's logic: ``CounselorService`` (one history -> safety check -> ``rollout.episode.answer``
-> safety check of the reply -> a typed ``CounselorAnswer``) and ``load_service`` (what ``escrag serve counselor``'s flags
describe). The routes are ``rollout.counselor.server``'s, the schemas ``rollout.counselor.protocol``'s.
"""

from __future__ import annotations

import asyncio
import dataclasses

from escrag.config import Config
from escrag.errors import UserError
from escrag.llm.endpoint import ChatEndpoint
from escrag.safety.classifier import RiskClassifier
from escrag.safety.reply import safety_reply, with_note
from escrag.safety.types import LEVELS, with_answer
from rollout.counselor.protocol import ChatCompletionRequest, CounselorAnswer, EscragInfo, Usage
from rollout.engines.base import SamplingParams
from rollout.episode import answer, as_scheduler, engine_chat


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

    async def respond(self, req: ChatCompletionRequest) -> CounselorAnswer:
        """Safety first: the conversation is assessed before anything is generated, and at high risk
        the answer is the safety reply with no model text anywhere (nothing is generated); otherwise
        the model's reply is assessed too (as one more turn of the conversation), and a high-risk
        reply is replaced the same way; at elevated (conversation or reply) the reply is followed by the
        gentle note of ``safety.elevated_note``. The checks run off the event loop."""
        history = req.history()
        self.check(history)
        risk = await asyncio.to_thread(self.classifier.assess, history)
        if risk.level == "high":
            return self._safety_answer(risk, {})
        usage: dict = {}
        ans = await answer(history, self._chat(req, usage), self.retriever, self.cfg,
                           rag=self.retriever is not None, seed=req.seed)
        after = await asyncio.to_thread(self.classifier.assess, with_answer(history, ans["response"]))
        if after.level == "high":
            return self._safety_answer(after, usage, "the model's reply read as high risk and was withheld")
        info = EscragInfo(think=ans["think"], initial=ans["initial"], exemplars=ans["exemplars"],
                          output=ans["output"], format_ok=ans["format_ok"], **risk.to_dict())
        level = max(risk, after, key=lambda a: LEVELS.index(a.level))
        return CounselorAnswer(text=with_note(ans["response"], level, self.cfg.safety), finish_reason=usage.get("finish_reason", "stop"),
                               escrag=info, usage=self._usage(usage))

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

    engine = make_engine(cfg, model_spec=args.policy)
    classifier = RiskClassifier.from_config(cfg, run=engine.call)  # on the engine's thread
    return CounselorService(cfg, classifier, retriever, engine=engine)
