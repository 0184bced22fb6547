"""The systems under evaluation: what each one is, how it is reached, and what identifies its answers.

Owns: ``validate`` (the eval config's cross-references), ``system_config`` (the project config a
system's server runs with), ``identity`` / ``answer_key`` (the answer cache key), ``Services`` (the
retriever and counselor servers a run starts and stops), ``counselor_args`` / ``by_counselor`` (which
systems share a counselor) and ``open_system`` (an async answer function per system).

Every system is an OpenAI-compatible chat endpoint:
- a *policy* (model spec or folder, RAG on or off, k) is served by the project's own counselor API,
  ``escrag serve counselor --policy SPEC (--retriever URL | --no-rag)``, started here as a child
  process (with ``escrag serve retriever --index DIR`` when a system needs RAG); each request carries
  the system's k (``retrieval_k``), so the systems of a k-sweep share one counselor (``Services``);
- an *endpoint* without RAG is called directly with the stage-1 prompt through the shared two-stage
  path (``rollout.episode.answer`` with ``rag=False``);
- an *endpoint* with RAG goes through the counselor API's ``--endpoint`` mode, so the two stages and
  the retrieval are the project's own.
A system whose answers are all cached starts nothing. Each answer is requested with a seed derived
from ``run.seed`` and the state id: every system sees the same seed for a state.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from escrag.cache import content_key
from escrag.config import Config, ConfigError, EndpointConfig, EvalSystemConfig, from_dict, to_dict
from escrag.errors import ServiceError
from escrag.llm.endpoint import CallLog, ChatEndpoint, ChatResult
from escrag.web.procs import ServerProcess
from retriever_server.protocol import Hit

EXEMPLAR_KEYS = tuple(k for k in Hit.model_fields if k != "score")  # what an answer record keeps of a hit

# ----------------------------------------------------------------------------- config checks


def _check_names(cfg: Config) -> dict[str, EvalSystemConfig]:
    systems: dict[str, EvalSystemConfig] = {}
    for i, s in enumerate(cfg.eval.systems):
        at = f"eval.systems[{i}]"
        if not s.name or "/" in s.name:
            raise ConfigError(f"{at}.name: a non-empty name without '/' is required")
        if s.name in systems:
            raise ConfigError(f"{at}.name: duplicate system name {s.name!r}")
        if (s.policy is None) == (s.endpoint is None):
            raise ConfigError(f"{at}: give exactly one of policy and endpoint")
        if s.endpoint is not None and s.endpoint not in cfg.endpoints:
            raise ConfigError(f"{at}.endpoint: no endpoint {s.endpoint!r} in endpoints "
                              f"(known: {', '.join(sorted(cfg.endpoints)) or 'none'})")
        systems[s.name] = s
    return systems


def _check_refs(cfg: Config, systems: dict[str, EvalSystemConfig]) -> None:
    def known(name: str, at: str) -> EvalSystemConfig:
        if name not in systems:
            raise ConfigError(f"{at}: no system {name!r} (known: {', '.join(systems)})")
        return systems[name]

    for i, row in enumerate(cfg.eval.table2):
        known(row.system, f"eval.table2[{i}].system")
    ks = [known(n, f"eval.k_sweep[{i}]") for i, n in enumerate(cfg.eval.k_sweep)]
    if any(not s.rag or s.k is None for s in ks) or len({s.k for s in ks}) != len(ks):
        raise ConfigError("eval.k_sweep: RAG systems, each with its own k set")
    h = cfg.eval.human
    if h.system is not None:
        known(h.system, "eval.human.system")
    for i, name in enumerate(h.baselines):
        known(name, f"eval.human.baselines[{i}]")
    if cfg.judge.endpoint is not None and cfg.judge.endpoint not in cfg.endpoints:
        raise ConfigError(f"judge.endpoint: no endpoint {cfg.judge.endpoint!r} in endpoints")


def _check_keys(cfg: Config, systems: dict[str, EvalSystemConfig]) -> None:
    """Fail before any work when an endpoint the run calls has no key in the environment."""
    used = {s.endpoint for s in systems.values() if s.endpoint} | ({cfg.judge.endpoint} - {None})
    for name in sorted(used):
        var = cfg.endpoints[name].api_key_env
        if var and not os.environ.get(var):
            raise ConfigError(f"endpoints.{name}.api_key_env: environment variable {var} is not set")


def validate(cfg: Config) -> dict[str, EvalSystemConfig]:
    """name -> system, after checking every reference; errors name the key."""
    if not cfg.eval.systems:
        raise ConfigError("eval.systems: at least one system is required")
    systems = _check_names(cfg)
    _check_refs(cfg, systems)
    _check_keys(cfg, systems)
    return systems


# ----------------------------------------------------------------------------- identity


def system_config(cfg: Config, system: EvalSystemConfig) -> Config:
    """The project config this system answers with: its overrides and its k applied."""
    extra = list(system.overrides) + ([f"retriever.k={system.k}"] if system.k is not None else [])
    return from_dict(to_dict(cfg), extra) if extra else cfg


def _folder_fingerprint(spec: str) -> list | str:
    """Names, sizes and mtimes of a local model folder's files, so retrained weights miss the cache."""
    path = Path(spec)
    if not path.is_dir():
        return spec
    return sorted([str(f.relative_to(path)), f.stat().st_size, f.stat().st_mtime_ns]
                  for f in path.rglob("*") if f.is_file())


def _prompt_version() -> str:
    """A hash of the prompt module's source (texts and layout): any edit there misses the cache."""
    from escrag import prompts

    return content_key(Path(prompts.__file__).read_text(encoding="utf-8"))[:16]


def _index_identity(cfg: Config) -> dict:
    if cfg.retriever.url:
        return {"url": cfg.retriever.url}
    from retriever_server.index import read_manifest

    m = read_manifest(index_dir(cfg))
    return {k: m[k] for k in ("embedder", "corpus_sha256", "count", "index_type")}


def identity(cfg: Config, system: EvalSystemConfig) -> dict:
    """Everything about a system that changes its answers (the state and the seed aside)."""
    scfg = system_config(cfg, system)
    out = {"rag": system.rag, "prompts": _prompt_version(), "temperature": cfg.eval.temperature,
           "rollout": to_dict(scfg.rollout),
           "max_history_turns": scfg.data.max_history_turns}
    if system.policy is not None:
        out.update(kind="policy", policy=system.policy, weights=_folder_fingerprint(system.policy),
                   dtype=scfg.policy.compute_dtype)
    else:
        ep = cfg.endpoints[system.endpoint]
        out.update(kind="endpoint", base_url=ep.base_url, model=ep.model)
    if system.rag:
        out.update(k=scfg.retriever.k, index=_index_identity(scfg))
    return out


def answer_key(ident: dict, sid: str, seed: int) -> str:
    return content_key({"system": ident, "state": sid, "seed": seed})


def index_dir(cfg: Config) -> Path:
    if not cfg.retriever.index_dir:
        raise ConfigError("retriever.index_dir: RAG systems need an exemplar index (build one with "
                          "`escrag index build --out DIR`) or a running retriever in retriever.url")
    return Path(cfg.retriever.index_dir)


# ----------------------------------------------------------------------------- servers


class Services:
    """The servers one evaluation run starts: a shared retriever, and one counselor at a time, kept up
    for the next system that would start the same one (``counselor_args``: a k-sweep's systems differ
    only in k, which each request sends as ``retrieval_k``), so a sweep loads its policy once."""

    def __init__(self, cfg: Config, config_file: Path, log_dir: Path, log=print):
        self.cfg, self.config_file, self.log_dir, self.log = cfg, config_file, log_dir, log
        self._retriever: ServerProcess | None = None
        self._counselor: tuple[list[str], ServerProcess] | None = None  # its arguments, the server

    def retriever_url(self) -> str:
        if self.cfg.retriever.url:
            return self.cfg.retriever.url
        if self._retriever is None:
            args = ["retriever", "--index", str(index_dir(self.cfg)), "--config", str(self.config_file)]
            self.log(f"[eval] starting escrag serve {' '.join(args)}")
            self._retriever = self._start("retriever", args)
        return self._retriever.url

    def _start(self, name: str, args: list[str]) -> ServerProcess:
        try:
            return ServerProcess(name, args, self.log_dir, self.cfg.run.server_timeout_s)
        except RuntimeError as exc:  # it exited or never became healthy; the message ends with its log
            raise ServiceError(f"escrag serve {' '.join(args)} did not start: {exc}") from None

    def counselor(self, system: EvalSystemConfig) -> str:
        """The URL of a counselor for ``system``: the running one if it was started with the same
        ``counselor_args``, else a new one (the running one is stopped first)."""
        args = counselor_args(self.cfg, system)
        if self._counselor is not None and self._counselor[0] == args:
            self.log(f"[eval] {system.name}: the running counselor serves it (k per request)")
            return self._counselor[1].url
        self.stop_counselor()
        rag = ["--retriever", self.retriever_url()] if system.rag else []
        full = ["counselor", *args, *rag, "--config", str(self.config_file)]
        self.log(f"[eval] {system.name}: starting escrag serve {' '.join(full)}")
        self._counselor = (args, self._start(f"counselor-{system.name}", full))
        return self._counselor[1].url

    def stop_counselor(self) -> None:
        if self._counselor is not None:
            self._counselor[1].stop()
            self._counselor = None

    def close(self) -> None:
        self.stop_counselor()
        if self._retriever is not None:
            self._retriever.stop()
            self._retriever = None


def counselor_args(cfg: Config, system: EvalSystemConfig) -> list[str] | None:
    """What starts ``system``'s counselor (its policy or endpoint, RAG or not, its overrides), without
    its k, which goes with each request; None for an endpoint without RAG (called directly)."""
    if system.policy is not None:
        args = ["--policy", system.policy]
    elif not system.rag:
        return None
    else:
        ep = cfg.endpoints[system.endpoint]
        args = ["--endpoint", ep.base_url, "--endpoint-model", ep.model]
        args += ["--endpoint-key-env", ep.api_key_env] if ep.api_key_env else []
        for key in ("max_concurrency", "requests_per_minute", "timeout_s", "retries", "backoff_s", "max_backoff_s"):
            if getattr(ep, key) is not None:  # the counselor calls the endpoint within its limits
                args += ["-o", f"counselor.endpoint.{key}={getattr(ep, key)}"]
    return args + ([] if system.rag else ["--no-rag"]) + [a for o in system.overrides for a in ("-o", o)]


def by_counselor(cfg: Config, systems: dict[str, EvalSystemConfig]) -> list[str]:
    """The system names in config order, but each next to the earlier ones its counselor serves."""
    keys = {n: str(counselor_args(cfg, s) or [n]) for n, s in systems.items()}  # [n]: called directly
    first: dict[str, int] = {}
    for i, name in enumerate(systems):
        first.setdefault(keys[name], i)
    return sorted(systems, key=lambda n: first[keys[n]])


# ----------------------------------------------------------------------------- answering


def _from_counselor(res: ChatResult) -> dict:
    """The answer record from a counselor reply (its ``escrag`` field carries the two stages)."""
    ex = res.raw.get("escrag") or {}
    return {"response": res.text, "output": ex.get("output", res.text), "think": ex.get("think", ""),
            "initial": ex.get("initial", ""), "format_ok": bool(ex.get("format_ok", False)),
            "exemplars": [{k: e[k] for k in EXEMPLAR_KEYS if k in e} for e in ex.get("exemplars") or []],
            "risk": ex.get("risk"), "prompt_tokens": res.prompt_tokens,
            "completion_tokens": res.completion_tokens, "cost": res.cost}


def _counselor_client(system: EvalSystemConfig, url: str, cfg: Config, log: CallLog,
                      prices: EndpointConfig | None = None) -> ChatEndpoint:
    """A client of a counselor this run started; ``prices`` bills the endpoint behind it (the
    counselor reports both stages' tokens; it enforces that endpoint's own limits)."""
    ep = EndpointConfig(base_url=f"{url}/v1", model=system.name, max_concurrency=cfg.eval.concurrency,
                        timeout_s=cfg.eval.answer_timeout_s, retries=2, backoff_s=1.0)
    if prices is not None:
        ep = dataclasses.replace(ep, price_input_per_m=prices.price_input_per_m,
                                 price_output_per_m=prices.price_output_per_m)
    return ChatEndpoint(f"system:{system.name}", ep, log)


def open_system(system: EvalSystemConfig, cfg: Config, services: Services, log: CallLog):
    """``answer(history, seed, state_id) -> awaitable answer record`` for ``system``; a counselor it
    needs is ``services``' (``Services.counselor``), stopped by them."""
    if counselor_args(cfg, system) is None:
        return _direct_answer(ChatEndpoint(f"system:{system.name}", cfg.endpoints[system.endpoint], log),
                              system_config(cfg, system), system)
    prices = cfg.endpoints[system.endpoint] if system.endpoint is not None else None
    client = _counselor_client(system, services.counselor(system), cfg, log, prices)
    return _counselor_answer(client, cfg, system)


def _counselor_answer(client: ChatEndpoint, cfg: Config, system: EvalSystemConfig):
    async def answer(history: list[dict], seed: int, sid: str) -> dict:
        res = await client.chat(history, temperature=cfg.eval.temperature, seed=seed,
                                tag=f"answer:{system.name}:{sid}", retrieval_k=system.k if system.rag else None)
        return _from_counselor(res)
    return answer


def _direct_answer(endpoint: ChatEndpoint, scfg: Config, system: EvalSystemConfig):
    """An endpoint without RAG: the stage-1 prompt through ``rollout.episode.answer`` (one stage)."""
    from rollout.episode import answer as episode_answer

    ro = scfg.rollout
    temperature = ro.temperature if scfg.eval.temperature is None else scfg.eval.temperature

    async def answer(history: list[dict], seed: int, sid: str) -> dict:
        spent = {"prompt_tokens": 0, "completion_tokens": 0, "cost": 0.0}

        async def chat(messages: list[dict], stage: int, stage_seed: int | None) -> str:
            res = await endpoint.chat(messages, temperature=temperature, top_p=ro.top_p, seed=stage_seed,
                                      max_tokens=ro.max_new_tokens_stage1, tag=f"answer:{system.name}:{sid}")
            for key in spent:
                spent[key] += getattr(res, key)
            return res.text

        ans = await episode_answer(history, chat, None, scfg, rag=False, seed=seed)
        return {"response": ans["response"], "output": ans["output"], "think": ans["think"], "initial": "",
                "format_ok": ans["format_ok"], "exemplars": [], "risk": None, **spent}
    return answer
