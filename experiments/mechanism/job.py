"""The mechanism table (issue 26 item 5): Table 2's arms on a task where retrieval must matter.

    python -m experiments.mechanism.job --config experiments/mechanism/mechanism.yaml [-o key=value ...]

Owns: the job. One SFT start on two-stage demonstrations of the task (``task.py``; a tiny
model from scratch in mechanism.yaml, SmolLM2-135M + LoRA in mechanism-smollm2.yaml), then per arm and training seed a GRPO run from it at one budget
(``grpo.steps``), then every policy answers the same held-out valid and test states with the same
seeds. Arms: Vanilla-GRPO (``rollout.rag: false``), scored alone and with RAG inference; ESCRAG-R1
(the paper's mask: only c trained); ESCRAG-R1 with ``rollout.train_stage1``; and the control, trained
and scored with shuffled exemplars (each topic's exemplar shows another topic's code). The summary
(``results/summary.json``) has each arm's per-seed means with bootstrap intervals over
states and each arm's paired difference to Vanilla-GRPO + RAG inference; every answer is saved. Each
finished part (the SFT start, each policy's scored answers) is kept under ``<output_dir>/parts/``, so a
rerun after a crash redoes only the part that was under way (``Parts``).

Departures from the job layout of ``ray_jobs.train_grpo``: the rollout, retriever and reward run in
this process (``rollout.episode.run_groups`` over the engine, ``RetrieverService.search_batch`` over a
FAISS index of the task's exemplars, the task's rule), not as Ray actors and HTTP servers: a tiny
model makes a step cost milliseconds, and starting servers per arm would cost more than training.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import random
import sys
import time
from pathlib import Path

from escrag.atomic import write_json
from escrag.config import Config, ConfigError, to_dict
from escrag.errors import run_main
from escrag.formats import format_reward, response_text
from experiments.mechanism import task as mech
from experiments.mechanism.config import load


class Parts:
    """The job's finished parts (the SFT start, each policy's scored answers) under ``<out>/parts/``, each
    written atomically when done and read back by a rerun with the same config and splits, so a crash
    loses at most the part under way. A rerun with another config stops with a message instead of
    mixing the two (not ``escrag.cache.JsonlCache``: a content-keyed cache would let two configs' runs
    take turns writing the one ``sft/`` folder their parts point to)."""

    def __init__(self, folder: Path, key: dict, log=print):
        self.folder, self.log = folder, log
        stamp = folder / "config.json"
        if stamp.exists() and json.loads(stamp.read_text()) != json.loads(json.dumps(key)):
            raise ConfigError(f"{folder} holds parts of a run with another config or splits: choose another "
                              f"run.output_dir, or delete {folder} to start over")
        folder.mkdir(parents=True, exist_ok=True)
        write_json(stamp, key)

    def get(self, name: str, make) -> dict:
        path = self.folder / f"{name}.json"
        if path.exists():
            self.log(f"[mechanism] {name}: read back from {path}")
            return json.loads(path.read_text())
        part = make()
        write_json(path, part)
        return part


class LocalRetriever:
    """The retriever's search over one table's exemplars, with the client's async interface."""

    def __init__(self, cfg: Config, embedder, table: dict[str, str], name: str):
        from retriever_server.index import VectorIndex, make_faiss_index
        from retriever_server.service import RetrieverService

        chunks = mech.chunks(table, name)
        vecs = embedder.encode([c["text"] for c in chunks])
        index = VectorIndex(make_faiss_index(vecs, "flat", cfg.retriever), chunks,
                            {"dim": embedder.dim, "index_type": "flat"})
        self.service = RetrieverService(index, embedder, cfg.retriever)

    def search(self, queries: list[str], k: int, excluded: list[str | None] | None = None) -> list[list[dict]]:
        return self.service.search_batch([(q, k, x) for q, x in zip(queries, excluded or [None] * len(queries))])

    async def retrieve(self, queries: list[str], k: int, exclude_dialogue_ids=None) -> list[list[dict]]:
        return self.search(queries, k, exclude_dialogue_ids)


class LocalReward:
    """The task's rule plus the format reward (as the reward server adds it), async like its client."""

    def __init__(self, table: dict[str, str]):
        self.table = table

    async def score(self, items: list[dict]) -> dict:
        fmt = [format_reward(it["output"]) for it in items]
        hit = [mech.mechanism_reward(self.table, it["history"], response_text(it["output"])) for it in items]
        return {"rewards": [h + f for h, f in zip(hit, fmt)], "rm_scores": hit, "format_rewards": fmt}


def arm_config(cfg: Config, arm: str, seed: int) -> Config:
    ro = dataclasses.replace(cfg.rollout, rag=arm != "vanilla", train_stage1=arm in ("escrag-stage1", "shuffled"))
    return dataclasses.replace(cfg, rollout=ro, run=dataclasses.replace(cfg.run, seed=seed))


# ------------------------------------------------------------------ SFT start


def sft_examples(cfg: Config, retriever: LocalRetriever):
    """``examples(tokenizer)`` for ``trainer.sft.train_sft``: per demonstration a stage-1 row (the
    draft) and a stage-2 row (p1 + draft + the feedback with the exemplar the draft retrieves -> a
    final copying that exemplar's code word), tokenised exactly as the rollout lays them out."""
    from rollout.episode import feedback_ids, prompt_ids, retrieval_query, stage1_messages

    mc, rng = cfg.mechanism, random.Random(f"{cfg.run.seed}/sft")
    train = mech.states("train")
    picks = [rng.choice(train) for _ in range(mc.sft_examples)]
    drafts = [mech.draft(s.problem if rng.random() < mc.sft_topic_rate else None,
                         rng.choice(mech.CODES) if rng.random() < mc.sft_code_rate else None) for s in picks]
    hits = retriever.search([retrieval_query(d, s.history) for s, d in zip(picks, drafts)], cfg.retriever.k)

    def build(tok):
        rows, eos = [], [tok.eos_token_id]
        for s, d, ex in zip(picks, drafts, hits):
            msgs1 = stage1_messages(s.history, cfg)
            p1, dids = prompt_ids(tok, msgs1), tok(d, add_special_tokens=False).input_ids + eos
            code = sorted(mech.codes_in(ex[0]["response"]))[0]
            p2 = p1 + dids + feedback_ids(tok, msgs1, ex, True)
            fids = tok(mech.final(s.problem, code), add_special_tokens=False).input_ids + eos
            rows += [(p1 + dids, [-100] * len(p1) + dids), (p2 + fids, [-100] * len(p2) + fids)]
        return rows, f"{len(picks)} mechanism demonstrations (draft + final)"

    return build


# ------------------------------------------------------------------ GRPO per arm and seed


def train_arm(cfg: Config, sft_dir: str, retriever, reward, log=print, train: list | None = None):
    """GRPO from ``sft_dir`` for ``grpo.steps`` steps (in process) on ``train`` states (default: the
    task's); returns (engine, metrics rows)."""
    from escrag.seeds import derive_seed
    from rollout.engines import make_engine
    from rollout.episode import run_groups
    from trainer.learner import Learner
    from trainer.sampler import StateSampler

    train = train or mech.states("train")
    learner, engine = Learner(cfg, model=sft_dir), make_engine(cfg, model_spec=sft_dir, seed=cfg.run.seed)
    sampler, rows = StateSampler(len(train), cfg.grpo.batch_states, cfg.run.seed), []
    for step in range(cfg.grpo.steps):
        batch = [train[i] for i in sampler.next_batch()]
        seeds = [derive_seed(cfg.run.seed, step, s.state_id) for s in batch]
        version = learner.version
        groups = asyncio.run(run_groups(batch, engine, retriever, reward, cfg, version, seeds))
        m = learner.step(groups)
        if learner.version != version:
            engine.load_weights(learner.export_weights(), learner.version)
        rows.append({"step": step + 1, **{k: m.get(k) for k in ("reward_mean", "format_mean", "kl", "zero_adv_groups")}})
        if (step + 1) % cfg.grpo.log_every == 0:
            log(f"  step {step + 1}: reward {m.get('reward_mean', 0):.3f} format {m.get('format_mean', 0):.2f}")
    return engine, rows


async def _answers(engine, cfg: Config, jobs: list, retriever, rag: bool) -> list[dict]:
    from rollout.episode import answer, engine_chat

    chat = engine_chat(engine, cfg)
    return list(await asyncio.gather(*(answer(s.history, chat, retriever, cfg, rag=rag, seed=sd) for s, sd in jobs)))


def score_policy(cfg: Config, engine, name: str, seed, split: str, jobs: list, retriever, reward, rag: bool) -> list[dict]:
    """Every answer of one policy to ``jobs`` ((state, sample, seed)) with its hit and format."""
    answers = asyncio.run(_answers(engine, cfg, [(s, sd) for s, _, sd in jobs], retriever, rag))
    scores = asyncio.run(reward.score([{"history": s.history, "output": a["output"]} for (s, _, _), a in zip(jobs, answers)]))
    return [{"system": name, "train_seed": seed, "split": split, "state_id": s.state_id, "sample": j,
             "topic": s.problem, "initial": a["initial_output"], "output": a["output"],
             "exemplar_ids": [e.get("id") for e in a["exemplars"]], "hit": h, "format": f,
             "draft_names_topic": s.problem in mech.words(a["initial_output"]) if rag else None}
            for (s, j, _), a, h, f in zip(jobs, answers, scores["rm_scores"], scores["format_rewards"])]


# ------------------------------------------------------------------ the table


SYSTEMS = {  # system -> (trained arm, RAG at inference, index: true or shuffled exemplars)
    "sft": (None, False, "true"), "sft+rag": (None, True, "true"),
    "vanilla": ("vanilla", False, "true"), "vanilla+rag": ("vanilla", True, "true"),
    "escrag": ("escrag", True, "true"), "escrag-stage1": ("escrag-stage1", True, "true"),
    "shuffled": ("shuffled", True, "shuffled"),
    # the controls that separate training with retrieval from scoring with it (issue 53 item 4)
    "shuffled>true": ("shuffled", True, "true"), "escrag-stage1>shuffled": ("escrag-stage1", True, "shuffled"),
}
BASELINE = "vanilla+rag"


def summarize(records: list[dict], cfg: Config) -> dict:
    """Per split and system: per-seed means of hit and format with bootstrap intervals over states,
    the mean over seeds, and the paired difference to ``BASELINE`` (per state, same seeds)."""
    from escrag.stats import bootstrap_ci, cluster_bootstrap_ci

    ev, out = cfg.eval, {}
    for split in sorted({r["split"] for r in records}, key=("valid", "test").index):
        rows = [r for r in records if r["split"] == split]
        per = {}  # (system, seed) -> state -> [hits]
        for r in rows:
            per.setdefault((r["system"], r["train_seed"]), {}).setdefault(r["state_id"], []).append(r)
        table = {}
        for system in SYSTEMS:
            keys = sorted((k for k in per if k[0] == system), key=lambda k: str(k[1]))
            if not keys:
                continue
            entry = {"per_seed": {}, "format": {}}
            for key in keys:
                by_state = per[key]
                entry["per_seed"][str(key[1])] = bootstrap_ci([_mean(v, "hit") for v in by_state.values()],
                                                               ev.bootstrap, ev.ci, cfg.run.seed)
                entry["format"][str(key[1])] = _mean([r for v in by_state.values() for r in v], "format")
            states = sorted(per[keys[0]])
            topics = [per[keys[0]][s][0]["topic"] for s in states]
            pooled = [sum(_mean(per[k][s], "hit") for k in keys) / len(keys) for s in states]
            entry["mean"] = bootstrap_ci(pooled, ev.bootstrap, ev.ci, cfg.run.seed)
            entry["mean_over_topics"] = cluster_bootstrap_ci(pooled, topics, ev.bootstrap, ev.ci, cfg.run.seed)
            entry["draft_names_topic"] = _mean([r for k in keys for v in per[k].values() for r in v
                                                if r["draft_names_topic"] is not None], "draft_names_topic")
            base = [k for k in per if k[0] == BASELINE]
            if base and system != BASELINE:
                b = [sum(_mean(per[k][s], "hit") for k in base) / len(base) for s in states]
                delta = [x - y for x, y in zip(pooled, b)]
                entry["vs_" + BASELINE] = bootstrap_ci(delta, ev.bootstrap, ev.ci, cfg.run.seed)
                entry[f"vs_{BASELINE}_over_topics"] = cluster_bootstrap_ci(delta, topics, ev.bootstrap, ev.ci,
                                                                           cfg.run.seed)
            table[system] = entry
        out[split] = table
    return out


def _mean(rows: list[dict], key: str) -> float | None:
    vals = [float(r[key]) for r in rows]
    return sum(vals) / len(vals) if vals else None


def eval_jobs(cfg: Config, split: str) -> list:
    from escrag.seeds import derive_seed

    mc = cfg.mechanism
    n = mc.valid_states if split == "valid" else mc.test_states
    return [(s, j, derive_seed(cfg.run.seed, "mechanism", s.state_id, j))
            for s in mech.states(split, n, cfg.run.seed) for j in range(mc.eval_samples)]


def run(cfg: Config, out: Path, splits: tuple[str, ...] = ("valid", "test"), log=print) -> dict:
    """The whole table; ``splits``: ("valid",) while choosing a recipe, test once for the reported one."""
    from escrag.embed import load_embedder
    from trainer.sft import train_sft

    t0, times, mc = time.time(), {}, cfg.mechanism
    out.mkdir(parents=True, exist_ok=True)
    tables = mech.worlds(mc)
    embedder = load_embedder(cfg.retriever.embedder)
    retr = {(split, kind): LocalRetriever(cfg, embedder, mech.shuffled(t, mc.shuffle_seed) if kind == "shuffled" else t,
                                          f"{split}-{kind}")
            for split, t in tables.items() for kind in ("true", "shuffled")}
    rewards = {split: LocalReward(t) for split, t in tables.items()}
    times["setup_s"] = time.time() - t0
    parts = Parts(out / "parts", {"config": to_dict(cfg), "splits": list(splits)}, log)
    sft = parts.get("sft", lambda: train_sft(cfg, out=out / "sft", log=log,
                                             examples=sft_examples(cfg, retr[("train", "true")])))
    times["sft_s"] = sft["seconds"]
    records, curves = [], {}
    jobs = {split: eval_jobs(cfg, split) for split in splits}

    def score(engine, acfg, system, seed) -> list[dict]:
        _, rag, kind = SYSTEMS[system]
        return [r for split in splits for r in score_policy(acfg, engine, system, seed, split, jobs[split],
                                                            retr[(split, kind)], rewards[split], rag)]

    from rollout.engines import make_engine

    def eval_sft() -> dict:
        t, engine = time.time(), make_engine(cfg, model_spec=sft["path"], seed=cfg.run.seed)
        recs = [r for system in ("sft", "sft+rag") for r in score(engine, cfg, system, None)]
        return {"records": recs, "seconds": time.time() - t}

    part = parts.get("eval-sft", eval_sft)
    records += part["records"]
    times["eval_sft_s"] = part["seconds"]
    for arm in mc.arms:
        for seed in mc.seeds:
            def train_and_score(arm=arm, seed=seed) -> dict:
                t, acfg = time.time(), arm_config(cfg, arm, seed)
                kind = "shuffled" if arm == "shuffled" else "true"
                log(f"[mechanism] {arm}, seed {seed}: {cfg.grpo.steps} GRPO steps")
                engine, curve = train_arm(acfg, sft["path"], retr[("train", kind)], rewards["train"], log)
                trained = time.time() - t
                recs = [r for s, (a, _, _) in SYSTEMS.items() if a == arm for r in score(engine, acfg, s, seed)]
                return {"records": recs, "curve": curve, "train_s": trained, "seconds": time.time() - t}

            part = parts.get(f"arm-{arm}-{seed}", train_and_score)
            records += part["records"]
            curves[f"{arm}/{seed}"] = part["curve"]
            times[f"train_{arm}_{seed}_s"], times[f"arm_{arm}_{seed}_s"] = part["train_s"], part["seconds"]
    with open(out / "answers.jsonl", "w") as fh:
        fh.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    times["total_s"] = time.time() - t0
    summary = {"table": summarize(records, cfg), "curves": curves, "sft_loss": [sft["losses"][0], sft["losses"][-1]],
               "seconds": {k: round(v, 1) for k, v in times.items()}, "worlds": tables, "splits": list(splits),
               "config": {"grpo_steps": cfg.grpo.steps, "batch_states": cfg.grpo.batch_states,
                          "group_size": cfg.rollout.group_size, "seeds": mc.seeds, "arms": mc.arms,
                          "model": cfg.policy.model, "k": cfg.retriever.k}}
    write_json(out / "summary.json", summary)
    return summary


def print_table(summary: dict, log=print) -> list[str]:
    fmt = "{:.3f} [{:.3f}, {:.3f}]".format
    lines = []
    for split, table in summary["table"].items():
        lines += [f"\n{split}: code-word hit rate (95% bootstrap over states; over the 12 topics where named)", "",
                  "| system | per training seed | mean over seeds | (topics) | paired vs vanilla+rag | (topics) | "
                  "draft names topic | format |", "|---|---|---|---|---|---|---|---|"]
        for system, e in table.items():
            seeds = "; ".join(f"{k}: {fmt(*v)}" for k, v in e["per_seed"].items())
            delta = fmt(*e["vs_" + BASELINE]) if "vs_" + BASELINE in e else "-"
            delta_t = fmt(*e[f"vs_{BASELINE}_over_topics"]) if f"vs_{BASELINE}_over_topics" in e else "-"
            topic = "-" if e["draft_names_topic"] is None else f"{e['draft_names_topic']:.2f}"
            fmts = "/".join(f"{v:.2f}" for v in e["format"].values())
            lines.append(f"| {system} | {seeds} | {fmt(*e['mean'])} | {fmt(*e['mean_over_topics'])} | {delta} | "
                         f"{delta_t} | {topic} | {fmts} |")
    for ln in lines:
        log(ln)
    return lines


def write_readme(summary: dict, out: Path, command: str) -> Path:
    """``<out>/README.md``: the tables, the command and the timings of ``summary``."""
    secs = summary["seconds"]
    lines = ["# The mechanism table (experiments/mechanism/README.md)", "", f"    {command}", "",
             f"Config: {json.dumps(summary['config'])}; SFT loss {summary['sft_loss'][0]:.3f} -> "
             f"{summary['sft_loss'][1]:.3f}.", *print_table(summary, log=lambda _: None), "",
             "Timings (s): " + ", ".join(f"{k[:-2]} {v:.0f}" for k, v in secs.items()), ""]
    path = out / "README.md"
    path.write_text("\n".join(lines))
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.mechanism.job", description=__doc__.splitlines()[0])
    p.add_argument("--config", default="experiments/mechanism/mechanism.yaml")
    p.add_argument("-o", "--override", action="append", default=[])
    p.add_argument("--split", choices=("valid", "test", "both"), default="both",
                   help="held-out states scored: valid while choosing a recipe, test once for the reported one")
    p.add_argument("--resummarize", action="store_true",
                   help="recompute summary.json's table and README.md from <output_dir>/answers.jsonl, no training")
    args = p.parse_args(argv)
    cfg = load(args.config, args.override)
    command = " ".join(["python -m experiments.mechanism.job", *(argv or sys.argv[1:])])

    def again() -> int:
        out = Path(cfg.run.output_dir)
        records = [json.loads(line) for line in (out / "answers.jsonl").read_text().splitlines() if line]
        summary = {**json.loads((out / "summary.json").read_text()), "table": summarize(records, cfg)}
        write_json(out / "summary.json", summary)
        print_table(summary)
        write_readme(summary, out, command.replace(" --resummarize", "") + "\n\n(table recomputed from answers.jsonl: "
                     + command + ")")
        return 0

    if args.resummarize:
        return run_main("mechanism", again)

    def go() -> int:
        splits = ("valid", "test") if args.split == "both" else (args.split,)
        summary = run(cfg, Path(cfg.run.output_dir), splits)
        print_table(summary)
        write_readme(summary, Path(cfg.run.output_dir), command)
        return 0

    return run_main("mechanism", go)


if __name__ == "__main__":
    sys.exit(main())
