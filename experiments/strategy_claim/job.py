"""Step 2 of experiments/strategy_claim (README.md): Table 2's arms on ESConv with the strategy reward.

    python -m experiments.strategy_claim.job [--config experiments/strategy_claim/config.yaml] [-o k=v ...]

Owns: the job. One SFT start (the demo's bootstrapped demonstrations), then per trained arm and seed a
GRPO run at one budget (``grpo.steps``) with the reward ``strategy:train`` + format, then every policy
answers the same seeded valid and test states with the same seeds; answers are scored by the strategy
reward of their split (``strategy:valid`` / ``strategy:test``). Systems: SFT, SFT+RAG, Vanilla-GRPO,
Vanilla-GRPO + RAG inference, ESCRAG-R1 (the paper's mask) and ESCRAG-R1 + ``rollout.train_stage1``.
The summary has per system the per-seed means, the mean over seeds, and the paired difference to
Vanilla-GRPO + RAG inference, each with intervals over states and over dialogues. Finished parts are
kept under ``<output_dir>/parts/`` (``experiments.mechanism.job.Parts``): a rerun redoes only the part
under way.

Departures from ``ray_jobs.train_grpo``: as in the mechanism job, the rollout, the retriever search
(``RetrieverService.search_batch`` over the full ESConv-train index, the state's own dialogue
excluded in training) and the rule run in this process, not as Ray actors and servers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

from escrag.atomic import write_json
from escrag.config import Config, run_paths, to_dict
from escrag.errors import run_main
from escrag.formats import format_reward
from experiments.mechanism.job import Parts, train_arm
from experiments.strategy_claim.config import load

SYSTEMS = {  # system -> (trained arm, RAG at inference)
    "sft": (None, False), "sft+rag": (None, True), "vanilla": ("vanilla", False), "vanilla+rag": ("vanilla", True),
    "escrag": ("escrag", True), "escrag-stage1": ("escrag-stage1", True)}
BASELINE = "vanilla+rag"


class IndexRetriever:
    """The retriever's search over an index folder, with the client's async interface."""

    def __init__(self, cfg: Config):
        from escrag.embed import load_embedder
        from retriever_server.build import build_index
        from retriever_server.index import load_index
        from retriever_server.service import RetrieverService

        folder = run_paths(cfg).index
        if not (folder / "manifest.json").is_file():
            build_index(cfg, out=folder)
        rc = cfg.retriever
        self.service = RetrieverService(load_index(folder, rc.embedder, rc), load_embedder(rc.embedder, rc.device), rc)

    async def retrieve(self, queries: list[str], k: int, exclude_dialogue_ids=None) -> list[list[dict]]:
        excluded = exclude_dialogue_ids or [None] * len(queries)
        return self.service.search_batch([(q, k, x) for q, x in zip(queries, excluded)])


class StrategyReward:
    """``strategy:SPLIT`` plus the format reward, as the reward server computes them, async like its client."""

    def __init__(self, split: str):
        from reward_server.rules import parse_rule

        self.rule = parse_rule(f"strategy:{split}")

    async def score(self, items: list[dict]) -> dict:
        fmt = [format_reward(it["output"]) for it in items]
        hit = [self.rule(it["history"], it["output"]) for it in items]
        return {"rewards": [h + f for h, f in zip(hit, fmt)], "rm_scores": hit, "format_rewards": fmt}


def arm_config(cfg: Config, arm: str, seed: int) -> Config:
    import dataclasses

    ro = dataclasses.replace(cfg.rollout, rag=arm != "vanilla", train_stage1=arm == "escrag-stage1")
    return dataclasses.replace(cfg, rollout=ro, run=dataclasses.replace(cfg.run, seed=seed))


def eval_jobs(cfg: Config, split: str) -> list:
    """(state, seed) of the split's seeded sample: fixed by the config before any training."""
    import random

    from escrag.data import load_states
    from escrag.seeds import derive_seed

    n = cfg.claim.valid_states if split == "valid" else cfg.claim.test_states
    states = random.Random(f"strategy-claim/{cfg.run.seed}/{split}").sample(load_states(split), n)
    return [(s, derive_seed(cfg.run.seed, "strategy-claim", s.state_id)) for s in states]


def score_policy(cfg: Config, engine, system: str, seed, split: str, jobs: list, retriever) -> list[dict]:
    from escrag.data import named_strategies
    from escrag.formats import parse_output
    from rollout.episode import answer, engine_chat

    rag = SYSTEMS[system][1]
    chat = engine_chat(engine, cfg)

    async def go():
        return await asyncio.gather(*(answer(s.history, chat, retriever, cfg, rag=rag, seed=sd) for s, sd in jobs))

    answers = asyncio.run(go())
    scores = asyncio.run(StrategyReward(split).score([{"history": s.history, "output": a["output"]}
                                                      for (s, _), a in zip(jobs, answers)]))
    return [{"system": system, "train_seed": seed, "split": split, "state_id": s.state_id, "dialogue_id": s.dialogue_id,
             "gold": list(s.strategies), "named": named_strategies(parse_output(a["output"]).think),
             "initial": a["initial_output"], "output": a["output"], "response": a["response"],
             "exemplar_strategies": [e["strategies"] for e in a["exemplars"]],
             "strategy": h, "format": f}
            for (s, _), a, h, f in zip(jobs, answers, scores["rm_scores"], scores["format_rewards"])]


def _cis(values: list[float], groups: list[str], cfg: Config) -> dict:
    from escrag.stats import bootstrap_ci, cluster_bootstrap_ci

    ev = cfg.eval
    return {"states": bootstrap_ci(values, ev.bootstrap, ev.ci, cfg.run.seed),
            "dialogues": cluster_bootstrap_ci(values, groups, ev.bootstrap, ev.ci, cfg.run.seed)}


def summarize(records: list[dict], cfg: Config, key: str = "strategy") -> dict:
    """Per split and system: per-seed and seed-mean ``key`` with intervals over states and dialogues,
    and the paired difference to ``BASELINE`` (same states, same sampling seeds)."""
    out = {}
    for split in [s for s in ("valid", "test") if any(r["split"] == s for r in records)]:
        per: dict = {}
        for r in records:
            if r["split"] == split and r.get(key) is not None:
                per.setdefault(r["system"], {}).setdefault(str(r["train_seed"]), {})[r["state_id"]] = r
        table = {}
        for system, seeds in per.items():
            states = sorted(next(iter(seeds.values())))
            dialogues = [next(iter(seeds.values()))[s]["dialogue_id"] for s in states]
            pooled = [sum(seeds[k][s][key] for k in seeds) / len(seeds) for s in states]
            entry = {"per_seed": {k: _cis([v[s][key] for s in states], dialogues, cfg) for k, v in seeds.items()},
                     "mean": _cis(pooled, dialogues, cfg),
                     "format": sum(r["format"] for v in seeds.values() for r in v.values()) / (len(seeds) * len(states))}
            if BASELINE in per and system != BASELINE:
                base = per[BASELINE]
                b = [sum(base[k][s][key] for k in base) / len(base) for s in states]
                entry["vs_" + BASELINE] = _cis([x - y for x, y in zip(pooled, b)], dialogues, cfg)
            if "sft+rag" in per and system != "sft+rag":
                b = [per["sft+rag"]["None"][s][key] for s in states]
                entry["vs_sft+rag"] = _cis([x - y for x, y in zip(pooled, b)], dialogues, cfg)
            table[system] = entry
        out[split] = table
    return out


def decision(table: dict) -> dict:
    """The rule written in README.md before the run, applied to the test table."""
    esc = table["escrag"]
    clear = esc["vs_" + BASELINE]["states"][1] > 0 and esc["vs_" + BASELINE]["dialogues"][1] > 0
    beat = all(table[a]["vs_sft+rag"]["states"][0] > 0 for a in ("escrag", "escrag-stage1"))
    return {"escrag_vs_vanilla_rag_clear_of_0": clear, "both_escrag_beat_sft_rag": beat,
            "claim_holds": clear and beat}


def run(cfg: Config, out: Path, log=print) -> dict:
    from rollout.engines import make_engine
    from trainer.sft import train_sft

    t0, times = time.time(), {}
    out.mkdir(parents=True, exist_ok=True)
    retriever = IndexRetriever(cfg)
    times["index_s"] = time.time() - t0
    parts = Parts(out / "parts", {"config": to_dict(cfg)}, log)
    sft = parts.get("sft", lambda: train_sft(cfg, out=out / "sft", log=log))
    times["sft_s"] = sft["seconds"]
    jobs = {split: eval_jobs(cfg, split) for split in ("valid", "test")}

    def score(engine, acfg, system, seed) -> list[dict]:
        return [r for split in jobs for r in score_policy(acfg, engine, system, seed, split, jobs[split], retriever)]

    def eval_sft() -> dict:
        t, engine = time.time(), make_engine(cfg, model_spec=sft["path"], seed=cfg.run.seed)
        return {"records": [r for system in ("sft", "sft+rag") for r in score(engine, cfg, system, None)],
                "seconds": time.time() - t}

    part = parts.get("eval-sft", eval_sft)
    records, curves, times["eval_sft_s"] = list(part["records"]), {}, part["seconds"]
    from escrag.data import load_states

    train = load_states(cfg.data.train)
    reward = StrategyReward("train")
    for arm in cfg.claim.arms:
        for seed in cfg.claim.seeds:
            def train_and_score(arm=arm, seed=seed) -> dict:
                t, acfg = time.time(), arm_config(cfg, arm, seed)
                log(f"[strategy-claim] {arm}, seed {seed}: {cfg.grpo.steps} GRPO steps")
                engine, curve = train_arm(acfg, sft["path"], retriever, reward, log, train=train)
                trained = time.time() - t
                recs = [r for s, (a, _) in SYSTEMS.items() if a == arm for r in score(engine, acfg, s, seed)]
                return {"records": recs, "curve": curve, "train_s": trained, "seconds": time.time() - t}

            part = parts.get(f"arm-{arm}-{seed}", train_and_score)
            records += part["records"]
            curves[f"{arm}/{seed}"] = part["curve"]
            times[f"arm_{arm}_{seed}_s"] = part["seconds"]
    with open(out / "answers.jsonl", "w") as fh:
        fh.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    times["total_s"] = time.time() - t0
    table = summarize(records, cfg)
    summary = {"table": table, "decision": decision(table["test"]), "curves": curves,
               "seconds": {k: round(v, 1) for k, v in times.items()},
               "config": {"grpo_steps": cfg.grpo.steps, "batch_states": cfg.grpo.batch_states,
                          "group_size": cfg.rollout.group_size, "seeds": cfg.claim.seeds, "model": cfg.policy.model,
                          "k": cfg.retriever.k, "valid_states": cfg.claim.valid_states,
                          "test_states": cfg.claim.test_states}}
    write_json(out / "summary.json", summary)
    return summary


def table_lines(summary: dict) -> list[str]:
    fmt = "{:.3f} [{:.3f}, {:.3f}]".format
    lines = []
    for split, table in summary["table"].items():
        lines += ["", f"{split}: strategy reward (95% bootstrap over states; over dialogues for the paired column too)", "",
                  "| system | per training seed | mean over seeds | paired vs vanilla+rag (states) | (dialogues) | format |",
                  "|---|---|---|---|---|---|"]
        for system, e in table.items():
            seeds = "; ".join(f"{k}: {fmt(*v['states'])}" for k, v in e["per_seed"].items())
            d = e.get("vs_" + BASELINE)
            lines.append(f"| {system} | {seeds} | {fmt(*e['mean']['states'])} | {fmt(*d['states']) if d else '-'} | "
                         f"{fmt(*d['dialogues']) if d else '-'} | {e['format']:.2f} |")
    return lines


def training_signal(summary: dict) -> dict:
    """Per trained arm: the mean strategy reward of its training rollouts (reward - format), over steps and seeds."""
    out: dict[str, list[float]] = {}
    for key, rows in summary["curves"].items():
        out.setdefault(key.split("/")[0], []).extend(r["reward_mean"] - r["format_mean"] for r in rows)
    return {arm: round(sum(v) / len(v), 4) for arm, v in out.items()}


def write_report(summary: dict, rescore: dict | None, path: Path, command: str) -> Path:
    """The results page of one run: its tables, the decision and where the numbers are (all read from
    ``summary`` and ``rescore``)."""
    lines = ["# strategy_claim: the result (generated from summary.json and rescore.json; do not edit)", "",
             f"    {command}", "", f"Config: {json.dumps(summary['config'])}.", *table_lines(summary), "",
             f"Decision (README.md's rule, on test): {json.dumps(summary['decision'])}.", "",
             "Strategy reward of the training rollouts, mean over steps and seeds (the signal GRPO had): "
             + json.dumps(training_signal(summary)) + "."]
    fmt = "{:+.3f} [{:+.3f}, {:+.3f}]".format
    for key, name in (("rm", "the training reward model"), ("proxy", "the independent MiniLM proxy")):
        if rescore:
            lines += ["", f"The same test answers scored by {name} (`rescore.json`, head {rescore['rm_dir']}): paired "
                      "vs vanilla+rag over states"]
            lines += [f"- {system}: {fmt(*e['vs_vanilla+rag']['states'])}" for system, e in rescore[key]["test"].items()
                      if "vs_vanilla+rag" in e]
    lines += ["", "Timings (s): " + ", ".join(f"{k[:-2]} {v:.0f}" for k, v in summary["seconds"].items()), ""]
    path.write_text("\n".join(lines))
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.strategy_claim.job", description=__doc__.splitlines()[0])
    p.add_argument("--config", default="experiments/strategy_claim/config.yaml")
    p.add_argument("-o", "--override", action="append", default=[])
    p.add_argument("--report", metavar="DIR", help="write DIR/README.md from DIR/summary.json (and rescore.json)")
    args = p.parse_args(argv)
    cfg = load(args.config, args.override)
    if args.report:
        folder = Path(args.report)
        rescore = json.loads((folder / "rescore.json").read_text()) if (folder / "rescore.json").exists() else None
        write_report(json.loads((folder / "summary.json").read_text()), rescore, folder / "README.md",
                     "python -m experiments.strategy_claim.job && python -m experiments.strategy_claim.rescore --rm DIR")
        return 0

    def go() -> int:
        summary = run(cfg, Path(cfg.run.output_dir))
        for line in table_lines(summary):
            print(line)
        print(f"decision: {summary['decision']}")
        return 0

    return run_main("strategy-claim", go)


if __name__ == "__main__":
    sys.exit(main())
