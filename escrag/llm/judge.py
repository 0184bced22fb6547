"""The seven-metric LLM judge (paper 4.1, 3.2 and Appendix A.2), over any OpenAI-compatible endpoint.

Owns: the judge prompt (``escrag/templates/<name>.txt``, found, read and versioned by
``escrag.llm.templates``), the strict parser of the judge's answer (``parse_json_object``, which
preference construction shares, and ``parse_scores``), the one repair-and-retry, ``JudgeResult`` and
``Judge.score(history, response)``. The evaluation scores systems with it; preference construction
scores candidate pairs with it.

Metrics (keys and names in ``escrag.pairs``): Client EI emotional impact, NE non-lecturing empathy,
TA therapeutic alliance; Counselor SC strategic coherence, TH theoretical application; Judge SF
strategy-client fit, PT problem targeting; each an integer 1..10.

Strict parsing: the answer must be one JSON object (a single surrounding Markdown code fence is
tolerated) with exactly the seven keys and integer values 1..10; anything else is invalid with a
reason. An invalid answer gets one repair call that shows the model its answer and the reason; when
that answer is invalid too, the result is ``valid=False`` with the reason (counted by callers, never
raised). An endpoint that fails for good gives ``endpoint_failed=True``: callers do not cache it, so
a rerun tries again.

Departure from the paper: its prompt (Figure 6) is not reproduced in the text we have; ``judge_v1`` is
written for this project from the paper's descriptions of the three perspectives, so scores are
comparable across our runs (same template version, same judge model) but not to the paper's numbers.
Every result records the template version (name and content hash).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from string import Template

from escrag.config import JudgeConfig
from escrag.llm import templates
from escrag.llm.endpoint import ChatEndpoint, EndpointError
from escrag.pairs import METRICS
from escrag.prompts import transcript

SECTIONS = ("system", "user", "repair")
DELIMITERS = re.compile(r"<(/?\s*(?:reply|conversation)\s*)>", re.I)  # the template's blocks
_FENCE = re.compile(r"\A```[a-zA-Z]*\s*\n(.*)\n\s*```\Z", re.DOTALL)


@dataclass(frozen=True)
class JudgeTemplate:
    name: str
    sha256: str  # of the file's bytes
    system: str
    user: str  # $history, $response
    repair: str  # $error

    @property
    def version(self) -> str:
        return templates.version(self.name, self.sha256)

    @classmethod
    def load(cls, name: str) -> JudgeTemplate:
        path = templates.locate(name, folder=False, key="judge.template", what="template")
        sections = templates.read_sections(path, SECTIONS)
        return cls(name, hashlib.sha256(path.read_bytes()).hexdigest(), **sections)

    def messages(self, history_text: str, response: str) -> list[dict]:
        """The judge's prompt; the judged texts cannot close the template's ``<reply>`` or
        ``<conversation>`` block early (their delimiters inside are escaped, ``escape_delimiters``)."""
        user = Template(self.user).substitute(history=escape_delimiters(history_text),
                                              response=escape_delimiters(response.strip()))
        return [{"role": "system", "content": self.system}, {"role": "user", "content": user}]

    def repair_message(self, error: str) -> dict:
        return {"role": "user", "content": Template(self.repair).substitute(error=error)}


def parse_json_object(text: str) -> tuple[dict | None, str]:
    """(object, "") when ``text`` is one JSON object (a single surrounding Markdown code fence is
    tolerated), else (None, the reason)."""
    body = text.strip()
    fenced = _FENCE.match(body)
    if fenced:
        body = fenced.group(1).strip()
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as exc:
        return None, f"not a JSON object ({exc.msg} at line {exc.lineno} column {exc.colno})"
    if not isinstance(obj, dict):
        return None, f"expected a JSON object, got {type(obj).__name__}"
    return obj, ""


def parse_scores(text: str) -> tuple[dict[str, int] | None, str]:
    """(scores, "") for a valid answer, else (None, the reason)."""
    obj, error = parse_json_object(text)
    if obj is None:
        return None, error
    missing = [k for k in METRICS if k not in obj]
    extra = sorted(set(obj) - set(METRICS))
    if missing or extra:
        what = [f"missing key(s) {', '.join(missing)}"] if missing else []
        what += [f"unexpected key(s) {', '.join(extra)}"] if extra else []
        return None, "; ".join(what)
    for k in METRICS:
        v = obj[k]
        if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= 10:
            return None, f"{k} must be an integer from 1 to 10, got {json.dumps(v)}"
    return {k: obj[k] for k in METRICS}, ""


def escape_delimiters(text: str) -> str:
    """``<reply>`` / ``</conversation>`` and the like inside a judged text as ``&lt;reply&gt;``, so a
    reply cannot end its block and write instructions to the judge after it."""
    return DELIMITERS.sub(lambda m: f"&lt;{m.group(1)}&gt;", text)


@dataclass
class JudgeResult:
    scores: dict[str, int] | None  # the seven metrics when valid
    valid: bool
    template: str  # template version, "judge_v1@<sha>"
    repaired: bool = False  # valid only after the repair call
    error: str = ""  # why the answer stayed invalid, or the endpoint's failure
    endpoint_failed: bool = False  # no answer at all: not cached, a rerun tries again
    answers: list[str] = field(default_factory=list)  # the raw judge answers (one or two)
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: dict) -> JudgeResult:
        return cls(**obj)


class Judge:
    """``await Judge(endpoint, cfg.judge).score(history, response)`` -> ``JudgeResult``."""

    def __init__(self, endpoint: ChatEndpoint, cfg: JudgeConfig):
        self.endpoint, self.cfg = endpoint, cfg
        self.template = JudgeTemplate.load(cfg.template)

    def history_text(self, history: list[dict]) -> str:
        turns = history[-self.cfg.max_history_turns:] if self.cfg.max_history_turns else history
        return transcript(turns)

    def key(self, history: list[dict], response: str) -> str:
        """Cache key: everything that changes the judge's answer."""
        ident = {"template": self.template.version, "base_url": self.endpoint.cfg.base_url,
                 "model": self.endpoint.cfg.model, "temperature": self.cfg.temperature,
                 "max_tokens": self.cfg.max_tokens, "json_mode": self.cfg.json_mode,
                 "history": self.history_text(history), "response": response.strip()}
        return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()

    async def _call(self, messages: list[dict], result: JudgeResult, tag: str | None) -> str:
        extra = {"response_format": {"type": "json_object"}} if self.cfg.json_mode else {}
        out = await self.endpoint.chat(messages, temperature=self.cfg.temperature,
                                       max_tokens=self.cfg.max_tokens, tag=tag, **extra)
        result.calls += 1
        result.prompt_tokens += out.prompt_tokens
        result.completion_tokens += out.completion_tokens
        result.cost += out.cost
        result.answers.append(out.text)
        return out.text

    async def score(self, history: list[dict], response: str, tag: str | None = None) -> JudgeResult:
        result = JudgeResult(None, False, self.template.version)
        messages = self.template.messages(self.history_text(history), response)
        try:
            answer = await self._call(messages, result, tag)
            scores, error = parse_scores(answer)
            if scores is None:
                repair = [*messages, {"role": "assistant", "content": answer},
                          self.template.repair_message(error)]
                scores, error = parse_scores(await self._call(repair, result, f"{tag}:repair" if tag else None))
                result.repaired = scores is not None
        except EndpointError as exc:
            result.error, result.endpoint_failed = str(exc), True
            return result
        result.scores, result.valid, result.error = scores, scores is not None, error
        return result
