"""ESC-Preference construction (paper 3.2 and Appendix A): ``escrag prefs build --config FILE``.

Owns: the Client-Counselor-Judge pipeline over ESConv train dialogue states, its typed stage records
(``CounselingStage``, ``PsychState``, ``Strategy``), the dominance filter ``dominates``, the prompt set
(``escrag/templates/prefs_v1/``), the call cache and budget (``Ledger``) and the build's outputs.
It reaches every model over OpenAI-compatible HTTP through ``escrag.llm.endpoint`` and scores responses
with ``escrag.llm.judge``; it imports no other layer.

Per state (``<dialogue_id>/<turn_index>``; ``data.train`` only, the other splits are refused):
1. Client simulation (``prefs.simulate_turns`` > 0): the gold counselor turn, then the client
   simulator's one-sentence turn; further rounds take the counselor turn from the generator.
2. Three-stage reasoning: every candidate model answers stage 1 (counseling stage), the evaluator
   rates the valid answers in one call (``select``) and the best and the worst are kept; each of the two
   goes on to stage 2 (psychological state: distress, resilience, motivation) where the candidates
   answer again from it, and the high path keeps the best, the low path the worst; likewise stage 3
   (therapeutic strategy with its rationale). Result: a high and a low trajectory.
3. The generator writes one counselor reply from each trajectory.
4. The judge (``escrag.llm.judge``, the seven metrics) scores both replies.
5. Dominance filter (``dominates``): kept when one reply is >= on all seven metrics and > on at least
   three; the dominating reply is ``chosen`` whichever trajectory it came from (provenance records it).

Resuming: every answered call is appended to ``records.jsonl`` under a key of everything that shapes
it (endpoint name, URL, model, messages, parameters and seed), with its state id and step. A rerun
walks the same pipeline and takes each answer from there, so an interrupted build continues where it
stopped and never pays for a call twice; counts and outputs are rebuilt from the whole record.
Budget: before each call the ledger adds the call's estimated cost (prompt characters / 4 x input
price + max_tokens x output price) to the cost recorded so far and to the calls in flight; when that
would pass ``prefs.budget_usd`` no new call starts, calls in flight finish and are kept, and the
build writes its outputs and stops (exit 3). Malformed answers are counted and drop their candidate or
state with a reason; they never crash the run. A call that fails for good (retries spent) leaves its
state unfinished: the build exits 1 and a rerun retries it.

Departures from the paper (said plainly): the paper shows its prompts only as figures (Figures 5-10),
which the text we have does not reproduce; ``prefs_v1`` is written for this project from the paper's
descriptions, so pairs are comparable across our builds, not to the paper's data. Stage names are
ESConv's three (exploration, comforting, action) and strategies ESConv's eight. The evaluator rates all
candidates of a step in one call (labels in a seeded order against position bias). The paper does not
say whether a low-trajectory reply that dominates is kept; we keep it, with ``chosen_trajectory: low``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import random
import re
from collections import Counter
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from string import Template

from escrag.atomic import write_json
from escrag.cache import JsonlCache, content_key
from escrag.config import Config, ConfigError, EndpointConfig, load_config
from escrag.data import SPLITS, DataError, DialogueState, load_states, resolve_path
from escrag.errors import EscragError
from escrag.llm import templates
from escrag.llm.endpoint import CallLog, ChatEndpoint, ChatResult, EndpointError
from escrag.llm.judge import Judge, parse_json_object
from escrag.pairs import METRICS, PreferencePair, write_pairs
from escrag.progress import progress_bar
from escrag.prompts import transcript
from escrag.seeds import derive_seed

SCORE_RANGE = (1, 10)  # the judge's scale (escrag/llm/judge.py)
MIN_STRICTLY_BETTER = 3  # paper 3.2: >= on all metrics and > on at least three
STEPS = ("stage", "state", "strategy")
STEP_NAMES = {"stage": "counseling stage", "state": "psychological state", "strategy": "therapeutic strategy"}
COUNSELING_STAGES = ("exploration", "comforting", "action")  # ESConv's stages (Liu et al., 2021)
STRATEGIES = ("Question", "Restatement or Paraphrasing", "Reflection of feelings", "Self-disclosure",
              "Affirmation and Reassurance", "Providing Suggestions", "Information", "Others")
PROMPTS = {"client": ("system", "user"), "counselor": ("system", "user"), "stage": ("system", "user"),
           "state": ("system", "user"), "strategy": ("system", "user"), "response": ("system", "user"),
           "select": ("system", "user", "repair", *STEPS)}
EXIT_BUDGET = 3
_LABEL = re.compile(r"\A\W*(?:client|counselor|counsellor|seeker|supporter|therapist|patient)\W*:\s*", re.I)
_QUOTES = {'"': '"', "'": "'", "\u201c": "\u201d"}


# --------------------------------------------------------------------------- the dominance filter


def _scores(metrics: dict, side: str) -> dict[str, float]:
    if not isinstance(metrics, dict):
        raise DataError(f"{side}: expected a mapping of the seven metrics, got {type(metrics).__name__}")
    missing, extra = [k for k in METRICS if k not in metrics], sorted(set(metrics) - set(METRICS))
    if missing or extra:
        raise DataError(f"{side}: " + "; ".join(([f"missing metric(s) {', '.join(missing)}"] if missing else [])
                                                + ([f"unknown metric(s) {', '.join(extra)}"] if extra else [])))
    lo, hi = SCORE_RANGE
    for k in METRICS:
        v = metrics[k]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not lo <= v <= hi:
            raise DataError(f"{side}.{k}: must be a number from {lo} to {hi}, got {v!r}")
    return {k: float(metrics[k]) for k in METRICS}


def dominates(preferred: dict[str, float], other: dict[str, float]) -> bool:
    """Paper 3.2: ``preferred`` is >= ``other`` on all seven metrics and > on at least three. A missing,
    unknown or out-of-range metric raises ``DataError``."""
    a, b = _scores(preferred, "preferred"), _scores(other, "other")
    return all(a[k] >= b[k] for k in METRICS) and sum(a[k] > b[k] for k in METRICS) >= MIN_STRICTLY_BETTER


def compare(a: dict, b: dict) -> str:
    """'better on X, worse on Y, equal on Z' of ``a`` against ``b`` (a reject's detail)."""
    better = sum(a[k] > b[k] for k in METRICS)
    worse = sum(a[k] < b[k] for k in METRICS)
    return f"high path better on {better}, worse on {worse}, equal on {len(METRICS) - better - worse}"


# --------------------------------------------------------------------------- typed stage records


@dataclass(frozen=True)
class CounselingStage:
    stage: str  # one of COUNSELING_STAGES
    rationale: str

    def text(self) -> str:
        return f"{self.stage}. {self.rationale}"


@dataclass(frozen=True)
class PsychState:
    distress: int  # 1..10: intensity of the client's emotional pain now
    resilience: int  # 1..10: coping resources and capacity to recover
    motivation: int  # 1..10: readiness to engage and work on the problem
    summary: str

    def text(self) -> str:
        return (f"distress {self.distress}/10, resilience {self.resilience}/10, motivation "
                f"{self.motivation}/10. {self.summary}")


@dataclass(frozen=True)
class Strategy:
    strategy: str  # one of STRATEGIES, spelt as there
    rationale: str

    def text(self) -> str:
        return f"{self.strategy}. {self.rationale}"


RECORDS = {"stage": CounselingStage, "state": PsychState, "strategy": Strategy}
CHOICES = {"stage": COUNSELING_STAGES, "strategy": STRATEGIES}


def _field(name: str, kind: str, value) -> tuple[object, str]:
    if kind == "int":
        lo, hi = SCORE_RANGE
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            return None, f"{name} must be an integer from {lo} to {hi}, got {json.dumps(value)}"
        return value, ""
    if not isinstance(value, str) or not value.strip():
        return None, f"{name} must be a non-empty string"
    if name in CHOICES:
        match = [c for c in CHOICES[name] if c.lower() == value.strip().lower()]
        if not match:
            return None, f"{name} must be one of {', '.join(CHOICES[name])}, got {json.dumps(value)}"
        return match[0], ""
    return value.strip(), ""


def parse_record(step: str, text: str):
    """(record, "") when ``text`` is the JSON object of ``step``'s record, else (None, the reason)."""
    cls = RECORDS[step]
    obj, error = parse_json_object(text)
    if obj is None:
        return None, error
    names = [f.name for f in fields(cls)]
    if set(obj) != set(names):
        return None, f"expected exactly the keys {', '.join(names)}, got {', '.join(sorted(obj)) or 'none'}"
    values = {}
    for f in fields(cls):
        values[f.name], error = _field(f.name, f.type, obj[f.name])
        if error:
            return None, error
    return cls(**values), ""


def clean_turn(text: str) -> str:
    """A conversational turn as a model wrote it, without a leading role label or wrapping quotes."""
    t = _LABEL.sub("", text.strip(), count=1).strip()
    if len(t) >= 2 and _QUOTES.get(t[0]) == t[-1]:
        t = t[1:-1].strip()
    return " ".join(t.split())


@dataclass(frozen=True)
class Step:
    """One kept state of a trajectory: the record, who wrote it and the evaluator's rating."""

    step: str  # one of STEPS
    endpoint: str  # the candidate's endpoint name
    record: CounselingStage | PsychState | Strategy
    score: int | None  # the evaluator's 1..10; None when it was the only valid candidate

    def to_json(self, model: str) -> dict:
        return {"step": self.step, "endpoint": self.endpoint, "model": model, "score": self.score,
                **asdict(self.record)}


def trajectory_text(path: list[Step]) -> str:
    return "\n".join(f"- {STEP_NAMES[s.step].capitalize()}: {s.record.text()}" for s in path)


# --------------------------------------------------------------------------- prompts


@dataclass(frozen=True)
class PromptSet:
    name: str
    version: str  # "<name>@<sha256 of the files, 12 hex>", recorded in every pair
    parts: dict  # prompt -> section -> text

    @classmethod
    def load(cls, name: str) -> PromptSet:
        folder = templates.locate(name, folder=True, key="prefs.templates", what="prompt set")
        digest, parts = hashlib.sha256(), {}
        for prompt, sections in PROMPTS.items():
            path = folder / f"{prompt}.txt"
            if not path.is_file():
                raise ConfigError(f"prefs.templates: {path} is missing")
            digest.update(prompt.encode() + b"\0" + path.read_bytes() + b"\0")
            parts[prompt] = templates.read_sections(path, sections)
        return cls(name, templates.version(name, digest.hexdigest()), parts)

    def messages(self, prompt: str, **values) -> list[dict]:
        p = self.parts[prompt]
        return [{"role": "system", "content": p["system"]},
                {"role": "user", "content": Template(p["user"]).substitute(values)}]

    def section(self, prompt: str, name: str, **values) -> str:
        return Template(self.parts[prompt][name]).substitute(values)


# --------------------------------------------------------------------------- calls: cache and budget


class BudgetReached(EscragError):
    """The next call would take the build past ``prefs.budget_usd``."""


def estimate_cost(cfg: EndpointConfig, messages: list[dict], max_tokens: int | None) -> float:
    """A call's cost before it is made: prompt characters / 4 as tokens, and ``max_tokens`` out."""
    chars = sum(len(m["content"]) for m in messages)
    return (chars / 4 * cfg.price_input_per_m + (max_tokens or 0) * cfg.price_output_per_m) / 1e6


class Ledger:
    """The build's record of answered calls (``records.jsonl``), its cost so far and its budget."""

    def __init__(self, path: Path, budget_usd: float | None):
        self.records = JsonlCache(path)
        self.budget = budget_usd
        self.spent = sum(r["cost"] for r in self.records.items.values())  # earlier runs included
        self.reserved = 0.0  # estimated cost of the calls in flight
        self.stopped = False
        self.made = self.reused = 0  # calls of this run: answered by the endpoint / from the record
        self.bar = None

    def _reserve(self, cfg: EndpointConfig, messages: list[dict], max_tokens: int | None) -> float:
        estimate = estimate_cost(cfg, messages, max_tokens)
        if self.budget is not None and (self.stopped or self.spent + self.reserved + estimate > self.budget):
            self.stopped = True
            raise BudgetReached(f"budget of ${self.budget:.2f} reached: ${self.spent:.4f} spent")
        self.reserved += estimate
        return estimate

    async def call(self, endpoint: ChatEndpoint, messages: list[dict], tag: str, params: dict) -> ChatResult:
        params = {k: v for k, v in params.items() if v is not None}
        key = content_key({"endpoint": endpoint.name, "base_url": endpoint.cfg.base_url,
                           "model": endpoint.cfg.model, "messages": messages, "params": params})
        hit = self.records.get(key)
        if hit is not None:
            self.reused += 1
            return ChatResult(hit["text"], {"cached": True})
        estimate = self._reserve(endpoint.cfg, messages, params.get("max_tokens"))
        try:
            result = await endpoint.chat(messages, tag=tag, **params)
        finally:
            self.reserved -= estimate
        self.spent += result.cost
        self.made += 1
        state_id, _, step = tag.partition("|")
        self.records.put(key, {"state_id": state_id, "step": step, "endpoint": endpoint.name,
                               "text": result.text, "prompt_tokens": result.prompt_tokens,
                               "completion_tokens": result.completion_tokens, "cost": result.cost})
        if self.bar is not None:
            self.bar.set_postfix(calls=self.made, reused=self.reused, cost=f"${self.spent:.4f}", refresh=False)
        return result

    def per_endpoint(self) -> dict:
        out: dict[str, dict] = {}
        for r in self.records.items.values():
            e = out.setdefault(r["endpoint"], {"calls": 0, "prompt_tokens": 0, "completion_tokens": 0,
                                               "cost_usd": 0.0})
            e["calls"] += 1
            e["prompt_tokens"] += r["prompt_tokens"]
            e["completion_tokens"] += r["completion_tokens"]
            e["cost_usd"] += r["cost"]
        return {n: {**e, "cost_usd": round(e["cost_usd"], 6)} for n, e in sorted(out.items())}


class Metered:
    """An endpoint as the pipeline and the judge call it: through the ledger (record, then budget)."""

    def __init__(self, endpoint: ChatEndpoint, ledger: Ledger):
        self.endpoint, self.ledger, self.cfg, self.name = endpoint, ledger, endpoint.cfg, endpoint.name

    async def chat(self, messages: list[dict], *, tag: str, **params) -> ChatResult:
        return await self.ledger.call(self.endpoint, messages, tag, params)


# --------------------------------------------------------------------------- one state


async def settle(*aws):
    """``asyncio.gather`` that lets every call finish (and be recorded) before it raises: a ``Drop``
    first (the state's outcome does not depend on timing), else the first error in order."""
    results = await asyncio.gather(*aws, return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        raise next((e for e in errors if isinstance(e, Drop)), errors[0])
    return results


class Drop(Exception):
    """The state gives no pair: ``reason`` (a summary key) and a detail."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


@dataclass
class Work:
    """One state in the build and what its answers looked like (counted once it finishes)."""

    state: DialogueState
    sid: str
    malformed: Counter = field(default_factory=Counter)  # answers that could not be used, by step
    repaired: Counter = field(default_factory=Counter)  # evaluator answers valid after the repair call


class Builder:
    """Runs the pipeline for one state at a time (``await builder.state(work)``)."""

    def __init__(self, cfg: Config, prompts: PromptSet, roles: dict[str, Metered], candidates: list[Metered]):
        self.cfg, self.pc, self.prompts = cfg, cfg.prefs, prompts
        self.roles, self.candidates = roles, candidates
        self.judge = Judge(roles["evaluator"], cfg.judge)
        self.json = {"response_format": {"type": "json_object"}} if self.pc.json_mode else {}

    def history_text(self, history: list[dict]) -> str:
        n = self.pc.max_history_turns
        return transcript(history[-n:] if n else history)

    def seed(self, w: Work, *parts) -> int:
        return derive_seed(self.cfg.run.seed, "prefs", w.sid, *parts)

    async def state(self, w: Work) -> dict:
        history = await self.simulate(w)
        high, low = await self.reason(w, history)
        if high == low:
            raise Drop("same_trajectory", "one valid candidate at every stage: nothing to contrast")
        replies = await settle(self.respond(w, history, high, "high"), self.respond(w, history, low, "low"))
        if replies[0] == replies[1]:
            raise Drop("identical_responses", "both trajectories gave the same reply")
        scores = await settle(*(self.evaluate(w, history, r, b) for r, b in zip(replies, ("high", "low"))))
        return {"history": history, "paths": {"high": high, "low": low},
                "replies": dict(zip(("high", "low"), replies)), "scores": dict(zip(("high", "low"), scores))}

    # ---- 1. client simulation
    async def simulate(self, w: Work) -> list[dict]:
        history = [dict(m) for m in w.state.history]
        for t in range(self.pc.simulate_turns):
            counselor = w.state.target if t == 0 else await self.turn(w, "counselor", history, t)
            history.append({"role": "assistant", "content": counselor})
            history.append({"role": "user", "content": await self.turn(w, "client", history, t)})
        return history

    async def turn(self, w: Work, who: str, history: list[dict], t: int) -> str:
        s = w.state
        values = {"history": self.history_text(history)}
        if who == "client":
            values.update(situation=s.situation or "(not given)", problem=s.problem or "(not given)",
                          emotion=s.emotion or "(not given)")
        role = "client" if who == "client" else "generator"
        limit = self.pc.client_max_tokens if who == "client" else self.pc.response_max_tokens
        out = await self.roles[role].chat(self.prompts.messages(who, **values), tag=f"{w.sid}|{who}:{t}",
                                          temperature=self.pc.temperature, max_tokens=limit,
                                          seed=self.seed(w, who, t))
        text = clean_turn(out.text.strip().splitlines()[0] if who == "client" and out.text.strip() else out.text)
        if not text or (who == "client" and len(text.split()) > self.pc.client_max_words):
            w.malformed[who] += 1
            raise Drop(f"malformed_{who}", f"simulated {who} turn {t + 1} unusable: {out.text[:200]!r}")
        return text

    # ---- 2. three-stage reasoning with intermediate selection
    async def reason(self, w: Work, history: list[dict]) -> tuple[list[Step], list[Step]]:
        high: list[Step] = []
        low: list[Step] = []
        for step in STEPS:
            if high == low:
                cands = await self.propose(w, step, history, high)
                best, worst = await self.select(w, step, history, high, cands, "both")
            else:
                ch, cl = await settle(self.propose(w, step, history, high), self.propose(w, step, history, low))
                (best, _), (_, worst) = await settle(self.select(w, step, history, high, ch, "high"),
                                                     self.select(w, step, history, low, cl, "low"))
            high, low = [*high, best], [*low, worst]
        return high, low

    async def propose(self, w: Work, step: str, history: list[dict], path: list[Step]) -> list[Step]:
        """Every candidate's answer for ``step`` given the path so far; the valid ones, in config order."""
        values = {"history": self.history_text(history)}
        values.update({s.step: s.record.text() for s in path})
        messages = self.prompts.messages(step, **values)
        context = content_key(trajectory_text(path))[:12]
        answers = await settle(*(
            ep.chat(messages, tag=f"{w.sid}|{step}:{ep.name}:{context}", temperature=self.pc.temperature,
                    max_tokens=self.pc.reasoning_max_tokens, seed=self.seed(w, step, ep.name), **self.json)
            for ep in self.candidates))
        valid = []
        for ep, out in zip(self.candidates, answers):
            record, _ = parse_record(step, out.text)
            if record is None:
                w.malformed[step] += 1
            else:
                valid.append(Step(step, ep.name, record, None))
        if not valid:
            raise Drop(f"malformed_{step}", f"no candidate gave a valid {STEP_NAMES[step]}")
        return valid

    async def select(self, w: Work, step: str, history: list[dict], path: list[Step], cands: list[Step],
                     branch: str) -> tuple[Step, Step]:
        """(best, worst) of the candidates by the evaluator's ratings; ties go to config order."""
        if len(cands) == 1:
            return cands[0], cands[0]
        order = list(range(len(cands)))
        random.Random(self.seed(w, "select", step, branch, trajectory_text(path))).shuffle(order)
        labels = [chr(ord("A") + i) for i in range(len(cands))]
        shown = {labels[j]: cands[i] for j, i in enumerate(order)}
        ratings = await self.rate(w, step, history, path, shown)
        rated = [Step(c.step, c.endpoint, c.record, ratings[label]) for label, c in shown.items()]
        rated.sort(key=lambda s: [c.endpoint for c in cands].index(s.endpoint))
        best = max(rated, key=lambda s: s.score)  # first of the highest
        worst = min(reversed(rated), key=lambda s: s.score)  # last of the lowest
        return best, worst

    async def rate(self, w: Work, step: str, history: list[dict], path: list[Step], shown: dict) -> dict:
        labels = list(shown)
        values = {"history": self.history_text(history), "step": STEP_NAMES[step],
                  "context": trajectory_text(path) or "(none yet: this is the first step)",
                  "candidates": "\n\n".join(f"[{k}]\n{json.dumps(asdict(c.record), ensure_ascii=False)}"
                                            for k, c in shown.items()),
                  "criteria": self.prompts.section("select", step), "labels": ", ".join(labels),
                  "example": json.dumps({k: 7 for k in labels})}
        messages = self.prompts.messages("select", **values)
        tag = f"{w.sid}|select:{step}:{content_key(values)[:12]}"
        params = {"temperature": self.cfg.judge.temperature, "max_tokens": self.pc.select_max_tokens, **self.json}
        out = await self.roles["evaluator"].chat(messages, tag=tag, **params)
        ratings, error = parse_ratings(out.text, labels)
        if ratings is None:
            repair = [*messages, {"role": "assistant", "content": out.text}, {"role": "user", "content":
                      self.prompts.section("select", "repair", error=error, labels=", ".join(labels))}]
            out = await self.roles["evaluator"].chat(repair, tag=f"{tag}:repair", **params)
            ratings, error = parse_ratings(out.text, labels)
            if ratings is None:
                w.malformed["select"] += 1
                raise Drop("malformed_select", f"evaluator's {STEP_NAMES[step]} ratings unusable: {error}")
            w.repaired["select"] += 1
        return ratings

    # ---- 3. paired responses, 4. seven-metric evaluation
    async def respond(self, w: Work, history: list[dict], path: list[Step], branch: str) -> str:
        messages = self.prompts.messages("response", history=self.history_text(history),
                                         trajectory=trajectory_text(path))
        out = await self.roles["generator"].chat(messages, tag=f"{w.sid}|response:{branch}",
                                                 temperature=self.pc.temperature,
                                                 max_tokens=self.pc.response_max_tokens, seed=self.seed(w, "response"))
        reply = clean_turn(out.text)
        if not reply:
            w.malformed["response"] += 1
            raise Drop("malformed_response", f"the generator's {branch}-path reply is empty")
        return reply

    async def evaluate(self, w: Work, history: list[dict], reply: str, branch: str) -> dict:
        result = await self.judge.score(history, reply, tag=f"{w.sid}|judge:{branch}")
        if result.endpoint_failed:
            raise EndpointError(result.error)
        if not result.valid:
            w.malformed["judge"] += 1
            raise Drop("malformed_judge", f"the judge's scores of the {branch}-path reply: {result.error}")
        w.repaired["judge"] += result.repaired
        return result.scores


def parse_ratings(text: str, labels: list[str]) -> tuple[dict | None, str]:
    """The evaluator's {label: 1..10} for exactly ``labels``, else (None, the reason)."""
    obj, error = parse_json_object(text)
    if obj is None:
        return None, error
    if set(obj) != set(labels):
        return None, f"expected exactly the keys {', '.join(labels)}, got {', '.join(sorted(obj)) or 'none'}"
    lo, hi = SCORE_RANGE
    for k in labels:
        v = obj[k]
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            return None, f"{k} must be an integer from {lo} to {hi}, got {json.dumps(v)}"
    return {k: obj[k] for k in labels}, ""


# --------------------------------------------------------------------------- the build


def role_names(cfg: Config) -> dict[str, str]:
    """{config key: endpoint name} of every role in use."""
    pc = cfg.prefs
    names = {f"candidates[{i}]": n for i, n in enumerate(pc.candidates)}
    names.update(generator=pc.generator, evaluator=pc.evaluator)
    if pc.client:
        names["client"] = pc.client
    return names


def check_config(cfg: Config) -> None:
    """Refuse a build that cannot run, before any call: roles, endpoints and the split."""
    pc = cfg.prefs
    if len(pc.candidates) < 2 or len(set(pc.candidates)) != len(pc.candidates):
        raise ConfigError("prefs.candidates: name at least two different endpoints (the paper uses three)")
    for key in ("generator", "evaluator"):
        if not getattr(pc, key):
            raise ConfigError(f"prefs.{key}: name an endpoint from endpoints")
    if pc.simulate_turns and not pc.client:
        raise ConfigError("prefs.client: simulate_turns > 0 needs a client-simulator endpoint")
    for key, name in role_names(cfg).items():
        if name not in cfg.endpoints:
            known = ", ".join(sorted(cfg.endpoints)) or "none"
            raise ConfigError(f"prefs.{key}: no endpoint {name!r} in endpoints (known: {known})")
    train = str(cfg.data.train)
    held = {str(cfg.data.test), str(cfg.data.eval), *(s for s in SPLITS if s != "train")}
    if train in held or any(resolve_path(train).resolve() == resolve_path(h).resolve()
                            for h in held if h in SPLITS or Path(h).is_file()):
        raise ConfigError(f"data.train: ESC-Preference is built from training dialogues only, not {train!r} "
                          "(valid and test stay unseen by the reward model and the retrieval corpus)")


def select_states(cfg: Config) -> list[DialogueState]:
    """``prefs.state_ids`` in that order, else a ``run.seed`` sample of ``prefs.states`` train states
    with at least ``min_history_turns`` turns of history (all of them when None), in data order."""
    pc = cfg.prefs
    states = load_states(cfg.data.train)
    if pc.state_ids:
        by_id = {s.state_id: s for s in states}
        missing = [i for i in pc.state_ids if i not in by_id]
        if missing:
            raise ConfigError(f"prefs.state_ids: no state {missing[0]!r} in data.train ({cfg.data.train})")
        return [by_id[i] for i in dict.fromkeys(pc.state_ids)]
    eligible = [s for s in states if len(s.history) >= pc.min_history_turns]
    if pc.states is None or pc.states >= len(eligible):
        return eligible
    keep = sorted(random.Random(cfg.run.seed).sample(range(len(eligible)), pc.states))
    return [eligible[i] for i in keep]


def output_dir(cfg: Config) -> Path:
    return Path(cfg.prefs.output_dir or Path(cfg.run.output_dir) / "esc_preference")


async def _outcome(builder: Builder, w: Work) -> dict:
    try:
        return {"status": "done", **await builder.state(w)}
    except Drop as drop:
        return {"status": "rejected", "reason": drop.reason, "detail": drop.detail}
    except BudgetReached:
        return {"status": "pending"}
    except EndpointError as exc:
        return {"status": "failed", "error": str(exc)}


async def run_states(builder: Builder, works: list[Work], ledger: Ledger, endpoints: list[ChatEndpoint]) -> dict:
    """Every state's outcome, ``prefs.concurrency`` states at a time, under a progress bar."""
    slots, outcomes = asyncio.Semaphore(builder.pc.concurrency), {}
    ledger.bar = progress_bar(total=len(works), desc="ESC-Preference", unit="state", dynamic_ncols=True)

    async def one(w: Work) -> None:
        async with slots:
            outcomes[w.sid] = await _outcome(builder, w)
        ledger.bar.update(1)

    try:
        await asyncio.gather(*(one(w) for w in works))
    finally:
        ledger.bar.close()
        await asyncio.gather(*(e.aclose() for e in endpoints))
    return outcomes


class Assembler:
    """Turns a state's outcome into a pair or a reject record (the dominance filter decides)."""

    def __init__(self, cfg: Config, prompts: PromptSet, judge_template: str):
        self.model = model = {n: cfg.endpoints[n].model for n in role_names(cfg).values()}
        pc = cfg.prefs
        self.models = {"candidates": {n: model[n] for n in pc.candidates}, "generator": model[pc.generator],
                       "evaluator": model[pc.evaluator], "client": model.get(pc.client)}
        self.base = {"source": "esc-preference", "split": str(cfg.data.train),
                     "simulated_turns": pc.simulate_turns, "prompt_version": prompts.version,
                     "judge_template": judge_template, "models": self.models, "seed": cfg.run.seed}

    def path_json(self, path: list[Step]) -> list[dict]:
        return [s.to_json(self.model[s.endpoint]) for s in path]

    def assemble(self, w: Work, out: dict) -> tuple[PreferencePair | None, dict | None]:
        s = w.state
        where = {"state_id": w.sid, "dialogue_id": s.dialogue_id, "turn_index": s.turn_index}
        if out["status"] == "rejected":
            return None, {**where, "reason": out["reason"], "detail": out["detail"]}
        sc, replies, paths = out["scores"], out["replies"], out["paths"]
        chosen = "high" if dominates(sc["high"], sc["low"]) else "low" if dominates(sc["low"], sc["high"]) else None
        if chosen is None:
            return None, {**where, "reason": "not_dominant", "detail": compare(sc["high"], sc["low"]),
                          "scores": sc, "replies": replies,
                          "trajectories": {b: self.path_json(p) for b, p in paths.items()}}
        other = "low" if chosen == "high" else "high"
        prov = {**self.base, **where, "chosen_trajectory": chosen,
                "trajectories": {"chosen": self.path_json(paths[chosen]), "rejected": self.path_json(paths[other])},
                "strategy": paths[chosen][-1].record.strategy, "stage": paths[chosen][0].record.stage,
                "problem": s.problem, "emotion": s.emotion}
        pair = PreferencePair(f"escpref-{s.dialogue_id}-{s.turn_index}", out["history"], replies[chosen],
                              replies[other], {"chosen": dict(sc[chosen]), "rejected": dict(sc[other])}, prov)
        return pair, None


def _means(pairs: list[PreferencePair], side: str) -> dict | None:
    if not pairs:
        return None
    return {k: round(sum(p.metrics[side][k] for p in pairs) / len(pairs), 3) for k in METRICS}


def summarize(cfg: Config, works: list[Work], outcomes: dict, pairs: list, rejects: list, ledger: Ledger,
              log: CallLog, versions: dict, files: dict) -> dict:
    status = Counter(o["status"] for o in outcomes.values())
    finished = [w for w in works if outcomes[w.sid]["status"] in ("done", "rejected")]
    return {
        "states": {"selected": len(works), "kept": len(pairs), "dropped": len(rejects),
                   "failed": status["failed"], "pending": status["pending"]},
        "dropped": dict(sorted(Counter(r["reason"] for r in rejects).items())),
        "malformed_answers": dict(sorted(sum((w.malformed for w in finished), Counter()).items())),
        "repaired_answers": dict(sorted(sum((w.repaired for w in finished), Counter()).items())),
        "chosen_trajectory": dict(Counter(p.provenance["chosen_trajectory"] for p in pairs)),
        "metric_means": {"chosen": _means(pairs, "chosen"), "rejected": _means(pairs, "rejected")},
        "endpoints": ledger.per_endpoint(),
        "cost_usd": round(ledger.spent, 6), "budget_usd": cfg.prefs.budget_usd,
        "stopped_by_budget": ledger.stopped,
        "this_run": {"calls_made": ledger.made, "calls_reused": ledger.reused, "endpoints": log.summary()},
        "failures": [{"state_id": sid, "error": o["error"]} for sid, o in outcomes.items() if o["status"] == "failed"],
        **versions, "outputs": files,
    }


def write_outputs(cfg: Config, out: Path, works: list[Work], outcomes: dict, asm: Assembler, ledger: Ledger,
                  log: CallLog, versions: dict) -> dict:
    from escrag.atomic import atomic_file

    pairs, rejects = [], []
    for w in works:
        if outcomes[w.sid]["status"] in ("done", "rejected"):
            pair, reject = asm.assemble(w, outcomes[w.sid])
            pairs += [pair] if pair else []
            rejects += [reject] if reject else []
    files = {"pairs": str(out / "pairs.jsonl"), "rejects": str(out / "rejects.jsonl"),
             "summary": str(out / "summary.json"), "records": str(out / "records.jsonl"),
             "calls": str(out / "calls.jsonl")}
    write_pairs(pairs, files["pairs"])
    with atomic_file(files["rejects"]) as fh:
        fh.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rejects)
    summary = summarize(cfg, works, outcomes, pairs, rejects, ledger, log, versions, files)
    write_json(files["summary"], summary)
    return summary


def build(cfg: Config) -> dict:
    """The whole build for ``cfg``; returns the summary (also ``summary.json``)."""
    check_config(cfg)
    prompts = PromptSet.load(cfg.prefs.templates)
    works = [Work(s, s.state_id) for s in select_states(cfg)]
    out = output_dir(cfg)
    out.mkdir(parents=True, exist_ok=True)
    ledger, log = Ledger(out / "records.jsonl", cfg.prefs.budget_usd), CallLog(out / "calls.jsonl")
    try:
        endpoints = {n: ChatEndpoint(n, cfg.endpoints[n], log) for n in sorted(set(role_names(cfg).values()))}
        metered = {n: Metered(e, ledger) for n, e in endpoints.items()}
        pc = cfg.prefs
        roles = {"generator": metered[pc.generator], "evaluator": metered[pc.evaluator],
                 "client": metered.get(pc.client)}
        builder = Builder(cfg, prompts, roles, [metered[n] for n in pc.candidates])
        outcomes = asyncio.run(run_states(builder, works, ledger, list(endpoints.values())))
    finally:
        log.close()
    versions = {"prompt_version": prompts.version, "judge_template": builder.judge.template.version}
    return write_outputs(cfg, out, works, outcomes, Assembler(cfg, prompts, versions["judge_template"]),
                         ledger, log, versions)


def format_summary(summary: dict) -> str:
    """The kept/dropped table and the cost per endpoint, as Markdown."""
    st = summary["states"]
    lines = ["| outcome | states |", "| --- | ---: |", f"| kept | {st['kept']} |"]
    lines += [f"| dropped: {reason} | {n} |" for reason, n in summary["dropped"].items()]
    lines += [f"| failed (rerun retries) | {st['failed']} |", f"| pending (budget) | {st['pending']} |",
              f"| **selected** | **{st['selected']}** |", "",
              "| endpoint | calls | prompt tokens | completion tokens | cost (USD) |", "| --- | ---: | ---: | ---: | ---: |"]
    lines += [f"| {n} | {e['calls']} | {e['prompt_tokens']} | {e['completion_tokens']} | {e['cost_usd']:.4f} |"
              for n, e in summary["endpoints"].items()]
    malformed = ", ".join(f"{k} {v}" for k, v in summary["malformed_answers"].items()) or "none"
    repaired = ", ".join(f"{k} {v}" for k, v in summary["repaired_answers"].items()) or "none"
    lines += ["", f"malformed answers: {malformed}; valid after the repair call: {repaired}"]
    return "\n".join(lines)


def build_main(args) -> int:
    """``escrag prefs build --config FILE [-o key=value]``: exit 0 when every state finished, 3 when the
    budget stopped the build, 1 when a state's call failed for good (a rerun retries it)."""
    import sys

    cfg = load_config(args.config, args.override)
    summary = build(cfg)
    print(format_summary(summary))
    st, files = summary["states"], summary["outputs"]
    print(f"{st['kept']} pairs -> {files['pairs']}; {st['dropped']} dropped -> {files['rejects']}; "
          f"cost ${summary['cost_usd']:.4f} ({summary['this_run']['calls_made']} calls this run, "
          f"{summary['this_run']['calls_reused']} from the record)")
    if summary["stopped_by_budget"]:
        print(f"escrag prefs build: stopped at the budget of ${cfg.prefs.budget_usd:.2f} (spent "
              f"${summary['cost_usd']:.4f}); {st['pending']} states pending, everything so far kept: raise "
              "prefs.budget_usd and rerun to continue", file=sys.stderr)
        return EXIT_BUDGET
    if st["failed"]:
        print(f"escrag prefs build: {st['failed']} states failed (an endpoint failed for good; first: "
              f"{summary['failures'][0]['error'][:200]}); rerun to retry them", file=sys.stderr)
        return 1
    return 0
