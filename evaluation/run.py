"""``escrag eval --config FILE``: answer sampled test states with every system, judge the answers, write
the tables, the offline proxy report and the figures. Cached and resumable.

Owns: the order of the run and its folder (``run.output_dir``):

    config.yaml            the resolved config; the servers the run starts read it
    states.jsonl           the sampled test states (id, history, gold reply)
    cache/answers.jsonl    one line per answered (system, state): key -> answer
    cache/judgments.jsonl  one line per judged (history, response): key -> judge result
    calls.jsonl            every LLM and counselor call this run made (escrag.llm.endpoint.CallLog)
    per_state.jsonl        one line per (state, system): the answer, its seven scores and
                           ``answer_risk`` (the crisis check of the conversation + the answer)
    table1.md/.csv         Table 1 layout; table2.md/.csv when eval.table2 names rows;
    figure3.png            metrics against k when eval.k_sweep names systems
    proxy.md/.csv          the offline proxy report ("offline proxy, not the paper's judge")
    summary.json           counts, calls, tokens, cost, template version, output files, and per
                           system the count and fraction of high / elevated answers (``risk``)
    logs/                  the started servers' logs

A rerun finds every answer and judgment in the cache and makes no call (keys: ``evaluation.systems
.answer_key``, ``escrag.llm.judge.Judge.key``). An answer or a judgment whose endpoint failed for good is
not cached: the run writes what it has, says how many failed, exits 1, and the next run retries them.
An answer the judge left malformed after its repair call is cached and counted in the tables.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import yaml

from escrag.atomic import atomic_file, write_json
from escrag.cache import JsonlCache
from escrag.config import Config, load_config, to_dict
from escrag.errors import UserError
from escrag.llm.endpoint import CallLog, ChatEndpoint, EndpointError
from escrag.llm.judge import Judge
from escrag.progress import progress_bar
from escrag.safety.classifier import RiskClassifier
from escrag.safety.types import level_counts, with_answer
from escrag.seeds import derive_seed
from evaluation import systems as sysmod
from evaluation.states import sample_states, write_states


class Progress:
    """A progress bar whose postfix shows the calls made and their cost so far."""

    def __init__(self, total: int, desc: str, log: CallLog):
        self.bar = progress_bar(total=total, desc=desc, unit="item", dynamic_ncols=True)
        self.log = log

    def step(self) -> None:
        self.bar.update(1)
        self.bar.set_postfix(calls=self.log.calls, cost=f"${self.log.cost:.4f}", refresh=False)

    def close(self) -> None:
        self.bar.close()


# ----------------------------------------------------------------------------- answers


async def _answer_todo(answer, todo: list, cache: JsonlCache, progress: Progress, failures: list) -> None:
    async def one(key, sid, history, seed):
        try:
            rec = await answer(history, seed, sid)
        except EndpointError as exc:
            failures.append({"state_id": sid, "error": str(exc)})
        else:
            cache.put(key, {**rec, "seed": seed})
        progress.step()
    await asyncio.gather(*(one(*item) for item in todo))


def generate(cfg: Config, systems: dict, states: list, services: sysmod.Services, cache: JsonlCache,
             log: CallLog) -> dict:
    """Answer every (system, state) missing from the cache; returns {system: [failures]}. Systems one
    counselor serves run one after another (``systems.by_counselor``), so it starts once."""
    failures: dict[str, list] = {}
    for name in sysmod.by_counselor(cfg, systems):
        system = systems[name]
        ident = sysmod.identity(cfg, system)
        todo = []
        for s in states:
            sid = s.state_id
            seed = derive_seed(cfg.run.seed, sid)
            key = sysmod.answer_key(ident, sid, seed)
            if key not in cache:
                todo.append((key, sid, s.history, seed))
        failures[name] = []
        if not todo:
            continue
        answer = sysmod.open_system(system, cfg, services, log)
        progress = Progress(len(todo), f"answers {name}", log)
        try:
            asyncio.run(_answer_todo(answer, todo, cache, progress, failures[name]))
        finally:
            progress.close()
    services.stop_counselor()  # the judge and the proxy's reward server come next
    return {name: failures[name] for name in systems}


def collect(cfg: Config, systems: dict, states: list, cache: JsonlCache) -> list[dict]:
    """Per-state records (state order, then system order) for every cached answer."""
    out = []
    idents = {name: sysmod.identity(cfg, s) for name, s in systems.items()}
    for s in states:
        sid = s.state_id
        seed = derive_seed(cfg.run.seed, sid)
        for name, system in systems.items():
            key = sysmod.answer_key(idents[name], sid, seed)
            if key in cache:
                out.append({"state_id": sid, "system": name, "label": system.label or name,
                            "answer_key": key, **cache.get(key)})
    return out


def answer_risk(records: list[dict], histories: dict, systems, classifier: RiskClassifier) -> dict:
    """Sets each record's ``answer_risk`` (the level of its conversation + its answer, docs/safety.md);
    returns per system the count and fraction of high and elevated answers."""
    found = classifier.assess_many([with_answer(histories[r["state_id"]], r["response"]) for r in records])
    for r, a in zip(records, found):
        r["answer_risk"] = a.level
    return {name: level_counts([a for r, a in zip(records, found) if r["system"] == name]) for name in systems}


# ----------------------------------------------------------------------------- judging


async def _judge_todo(judge: Judge, todo: list, cache: JsonlCache, progress: Progress) -> None:
    async def one(key, history, rec):
        res = await judge.score(history, rec["response"], tag=f"judge:{rec['system']}:{rec['state_id']}")
        if not res.endpoint_failed:
            cache.put(key, res.to_json())
        progress.step()
    await asyncio.gather(*(one(*item) for item in todo))


def judge_records(cfg: Config, records: list[dict], histories: dict, cache: JsonlCache, log: CallLog) -> str:
    """Attach ``judge`` (a JudgeResult dict, or None when the endpoint failed) to each record; returns
    the judge template's version."""
    endpoint = ChatEndpoint(f"judge:{cfg.judge.endpoint}", cfg.endpoints[cfg.judge.endpoint], log)
    judge = Judge(endpoint, cfg.judge)
    for r in records:
        r["judge_key"] = judge.key(histories[r["state_id"]], r["response"])
    todo = [(r["judge_key"], histories[r["state_id"]], r) for r in records if r["judge_key"] not in cache]
    todo = list({item[0]: item for item in todo}.values())  # one call per distinct (history, response)
    if todo:
        progress = Progress(len(todo), "judge", log)
        try:
            asyncio.run(_judge_todo(judge, todo, cache, progress))
        finally:
            progress.close()
    for r in records:
        r["judge"] = cache.get(r["judge_key"])
    return judge.template.version


# ----------------------------------------------------------------------------- outputs


def _notes(cfg: Config, template: str, n_states: int) -> list[str]:
    ep = cfg.endpoints[cfg.judge.endpoint]
    return [f"Judge: `{ep.model}` at `{ep.base_url}`, template `{template}`, temperature "
            f"{cfg.judge.temperature}. States: {n_states} from ESConv `{cfg.data.test}` "
            f"(seed {cfg.run.seed}). Intervals: {cfg.eval.bootstrap} bootstrap resamples over states."]


def write_judge_outputs(cfg: Config, run_dir: Path, records: list, systems: dict, template: str,
                        n_states: int) -> list[str]:
    from evaluation import tables

    b, ci, seed = cfg.eval.bootstrap, cfg.eval.ci, cfg.run.seed
    notes = _notes(cfg, template, n_states)
    names = [(n, s.label or n) for n, s in systems.items()]
    rows = tables.score_rows(records, names, b, ci, seed)
    files = tables.write_table(run_dir / "table1", tables.table1_markdown(rows, "Table 1: LLM-judge scores",
                                                                          notes), rows)
    if cfg.eval.table2:
        rows2 = tables.score_rows(records, [(r.system, r.label) for r in cfg.eval.table2], b, ci, seed)
        files += tables.write_table(run_dir / "table2", tables.table2_markdown(
            rows2, "Table 2: ablation on framework components", notes), rows2)
    if cfg.eval.k_sweep:
        rows3 = tables.score_rows(records, [(n, n) for n in cfg.eval.k_sweep], b, ci, seed)
        ks = [systems[n].k for n in cfg.eval.k_sweep]
        files.append(tables.figure3(rows3, ks, run_dir / "figure3.png",
                                    "Judge scores against the number of retrieved exemplars"))
    return files


def _judge_counts(records: list[dict]) -> dict:
    judged = [r["judge"] for r in records if r.get("judge")]
    return {"judged": len(judged), "valid": sum(j["valid"] for j in judged),
            "malformed": sum(not j["valid"] for j in judged),
            "repaired": sum(j["repaired"] for j in judged),
            "failed": sum(r.get("judge") is None for r in records),
            "cost_total": sum(j["cost"] for j in judged)}


def prepare(cfg: Config) -> tuple[Path, Path, list, dict]:
    systems = sysmod.validate(cfg)
    run_dir = Path(cfg.run.output_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    config_file = run_dir / "config.yaml"
    with atomic_file(config_file) as fh:
        yaml.safe_dump(to_dict(cfg), fh, sort_keys=False)
    states = sample_states(cfg)
    write_states(states, run_dir / "states.jsonl")
    return run_dir, config_file, states, systems


def run_eval(cfg: Config, log_fn=print) -> dict:
    """The whole run; returns the summary (also written to summary.json)."""
    run_dir, config_file, states, systems = prepare(cfg)
    log_fn(f"[eval] {len(states)} test states, {len(systems)} systems -> {run_dir}")
    log = CallLog(run_dir / "calls.jsonl")
    answers = JsonlCache(run_dir / "cache" / "answers.jsonl")
    services = sysmod.Services(cfg, config_file, run_dir / "logs", log_fn)
    try:
        failures = generate(cfg, systems, states, services, answers, log)
        records = collect(cfg, systems, states, answers)
        histories = {s.state_id: s.history for s in states}
        files, summary = [], {"states": len(states), "systems": list(systems), "run_dir": str(run_dir)}
        summary["risk"] = answer_risk(records, histories, systems, RiskClassifier.from_config(cfg))
        if cfg.judge.endpoint:
            judgments = JsonlCache(run_dir / "cache" / "judgments.jsonl")
            template = judge_records(cfg, records, histories, judgments, log)
            files += write_judge_outputs(cfg, run_dir, records, systems, template, len(states))
            summary["judge"] = {"template": template, "endpoint": cfg.judge.endpoint, **_judge_counts(records)}
        if cfg.eval.proxy.enabled:
            from evaluation.proxy import write_proxy_report

            files += write_proxy_report(cfg, run_dir, records, histories, systems, config_file, log_fn)
    finally:
        services.close()
        log.close()
    _write_per_state(run_dir / "per_state.jsonl", records)
    summary.update(answers={n: {"ok": sum(r["system"] == n for r in records), "failed": len(f)}
                            for n, f in failures.items()},
                   calls=log.summary(), calls_made=log.calls, cost_this_run=log.cost,
                   outputs=[str(Path(f).name) for f in ["per_state.jsonl", *files]])
    write_json(run_dir / "summary.json", summary)
    return summary


def _write_per_state(path: Path, records: list[dict]) -> None:
    with atomic_file(path) as fh:
        for r in records:
            fh.write(json.dumps(r, ensure_ascii=False) + "\n")


def _report(summary: dict) -> int:
    run_dir = summary["run_dir"]
    print(f"[eval] {summary['calls_made']} calls this run, ${summary['cost_this_run']:.4f}; "
          f"outputs in {run_dir}: {', '.join(summary['outputs'])}")
    failed = sum(a["failed"] for a in summary["answers"].values())
    print("[eval] crisis check of conversation + answer: " + "; ".join(
        f"{n} {r['high']}/{r['n']} high, {r['elevated']} elevated" for n, r in summary["risk"].items()))
    judge = summary.get("judge") or {}
    if judge:
        print(f"[eval] judge {judge['template']}: {judge['valid']} valid, {judge['malformed']} stayed "
              f"malformed ({judge['repaired']} repaired), {judge['failed']} failed")
    if failed or judge.get("failed"):
        print(f"[eval] {failed} answers and {judge.get('failed', 0)} judgments failed (see calls.jsonl); "
              "rerun the same command to retry them, finished items are kept")
        return 1
    return 0


def main(args) -> int:
    """Handler of ``escrag eval --config FILE [-o key=value ...]``."""
    if not args.config:
        raise UserError("escrag eval: --config FILE is required (see configs/eval-*.yaml)")
    cfg = load_config(args.config, args.override)
    return _report(run_eval(cfg))

