"""The whole ESCRAG-R1 recipe as one job: preference pairs -> exemplar index -> reward model ->
cold-start SFT -> retrieval-augmented GRPO, each stage fed by the one before.

    python -m ray_jobs.pipeline --config configs/paper-3b.yaml [--until sft] [-o key=value ...]
    escrag pipeline --config ...                      (same job)
    ray job submit ... -- python -m ray_jobs.pipeline --config ...

Owns: the order of the stages, what each one reads from the ones before, and the manifest
(``<output_dir>/pipeline.json``) that lets a rerun skip finished stages. A stage's key is a hash of
the config values its output depends on, the contents of the input files it reads and the keys of the
stages it reads from; a stage whose recorded key matches (and whose output exists) is skipped, one
whose key changed runs again, and so do the stages after it. An interrupted GRPO stage with an
unchanged key resumes from its last checkpoint; with a changed key it starts over in a fresh folder.

What flows (``escrag.config.run_paths``): the pairs (``reward.pairs``, else silver pairs bootstrapped
from ESConv train) train the reward head and, with ``retriever.source: prefs``, make the exemplar
corpus; GRPO's policy, its rollout engines and its KL reference all start from the SFT model, and its
reward and retriever servers serve this run's reward head and index.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import shutil
import sys
import time
from pathlib import Path

from escrag.atomic import write_json
from escrag.config import Config, load_config, run_paths, to_dict
from escrag.errors import ServiceError, UserError, run_main

STAGES = ("pairs", "index", "rm", "sft", "grpo")
UPSTREAM = {"pairs": (), "index": ("pairs",), "rm": ("pairs",), "sft": (), "grpo": ("index", "rm", "sft")}
# config values that change how a stage runs but not what it makes
RUNTIME = {"url", "timeout_s", "wait_s", "backoff_s", "max_wait_ms", "max_queue", "max_queries",
           "max_query_chars", "max_body_bytes", "max_batch", "blas_threshold", "hnsw_ef_search",
           "ivf_nprobe", "embed_batch_size", "feature_cache", "feature_batch_size", "device", "index_dir",
           "head_dir", "num_workers", "torch_threads", "worker_cpus", "worker_gpus", "max_reissues",
           "learner_cpus", "learner_gpus", "learner_torch_threads",
           "restart_timeout_s", "restart_poll_s", "vllm_gpu_memory", "checkpoint_every", "keep_checkpoints",
           "log_every", "tensorboard", "log_samples", "k"}


def _section(cfg: Config, name: str, keep: tuple = ()) -> dict:
    values = to_dict(getattr(cfg, name))
    return {k: v for k, v in values.items() if k in keep} if keep else \
        {k: v for k, v in values.items() if k not in RUNTIME}


def _file_hash(path) -> str | None:
    path = Path(path) if path else None
    if path is None or not path.is_file():
        return None
    return hashlib.sha256(path.read_bytes()).hexdigest()


def stage_inputs(cfg: Config, stage: str) -> dict:
    """The config values (and input-file contents) a stage's output depends on."""
    data = {"train": cfg.data.train, "train_file": _file_hash(cfg.data.train), "seed": cfg.run.seed}
    if stage == "pairs":
        return {**data, "pairs": _file_hash(cfg.reward.pairs), "max_pairs": cfg.reward.max_pairs,
                "silver": [cfg.reward.silver_negatives, cfg.reward.silver_per_state]}
    if stage == "index":
        return {**data, "test": cfg.data.test, "retriever": _section(cfg, "retriever")}
    if stage == "rm":
        return {**data, "reward": _section(cfg, "reward"), "turns": cfg.data.max_history_turns}
    if stage == "sft":
        return {**data, "sft": _section(cfg, "sft"), "data_file": _file_hash(cfg.sft.data),
                "policy": _section(cfg, "policy"), "turns": cfg.data.max_history_turns}
    return {**data, "data": _section(cfg, "data"), "policy": _section(cfg, "policy"),
            "rollout": _section(cfg, "rollout"), "grpo": _section(cfg, "grpo"), "k": cfg.retriever.k,
            "rule": cfg.reward.rule}


class Manifest:
    """``pipeline.json``: per stage, its key, its state ("running" or "done") and its outputs."""

    def __init__(self, path: Path):
        self.path = path
        self.stages = json.loads(path.read_text())["stages"] if path.is_file() else {}

    def done(self, stage: str, key: str) -> bool:
        entry = self.stages.get(stage, {})
        return entry.get("key") == key and entry.get("state") == "done" and \
            all(Path(p).exists() for p in entry.get("outputs", {}).values())

    def running(self, stage: str, key: str) -> bool:
        entry = self.stages.get(stage, {})
        return entry.get("key") == key and entry.get("state") == "running"

    def record(self, stage: str, key: str, state: str, outputs: dict, summary: dict | None = None) -> None:
        self.stages[stage] = {"key": key, "state": state, "outputs": {k: str(v) for k, v in outputs.items()},
                              "summary": summary or {}, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        write_json(self.path, {"stages": self.stages})


# ------------------------------------------------------------------ the stages


def make_pairs(cfg: Config, log=print) -> dict:
    from escrag.pairs import load_pairs, silver_pairs, write_pairs

    path = run_paths(cfg).pairs
    if cfg.reward.pairs:
        pairs = load_pairs(path)  # validates every line
        log(f"[pipeline] {len(pairs)} preference pairs from {path}")
    else:
        log("[pipeline] bootstrapping silver pairs from ESConv train (a stand-in for ESC-Preference)")
        pairs = silver_pairs(cfg)
        write_pairs(pairs, path)
    return {"pairs": len(pairs)}


def build_index(cfg: Config, log=print) -> dict:
    from retriever_server.build import build_index as build
    from retriever_server.index import read_manifest

    paths = run_paths(cfg)
    log(f"[pipeline] embedding the {cfg.retriever.source} exemplar corpus with {cfg.retriever.embedder}")
    out = build(cfg, out=paths.index, pairs=str(paths.pairs) if cfg.retriever.source == "prefs" else None)
    m = read_manifest(out)
    return {"chunks": m["count"], "dim": m["dim"], "embedder": m["embedder"]}


def train_rm(cfg: Config, log=print) -> dict:
    from reward_server.train import train_reward_model

    paths = run_paths(cfg)
    log(f"[pipeline] training the linear reward head on frozen {cfg.reward.backbone} features")
    m = train_reward_model(cfg, paths.pairs, paths.rm, log=log)
    return {k: m[k] for k in ("n_train", "n_heldout", "heldout_accuracy", "heldout_margin")}


def train_sft(cfg: Config, log=print) -> dict:
    from trainer.sft import train_sft as sft

    summary = sft(cfg, out=run_paths(cfg).sft, log=log)
    return {k: summary[k] for k in ("examples", "steps", "seconds")} | {
        "loss_first": summary["losses"][0], "loss_last": summary["losses"][-1]}


def grpo_config(cfg: Config) -> Config:
    """GRPO as the pipeline runs it: policy, engines and KL reference are the SFT model; the servers
    serve this run's index and reward head; outputs go to ``run_paths(cfg).grpo``."""
    paths = run_paths(cfg)
    return dataclasses.replace(
        cfg, run=dataclasses.replace(cfg.run, output_dir=str(paths.grpo)),
        policy=dataclasses.replace(cfg.policy, model=str(paths.sft)),
        retriever=dataclasses.replace(cfg.retriever, index_dir=str(paths.index)),
        reward=dataclasses.replace(cfg.reward, head_dir=str(paths.rm)))


def train_grpo(cfg: Config, log=print, resume: bool = False) -> dict:
    """``grpo.backend``: the local learner, or OpenRLHF's trainer (paper presets) from the SFT model."""
    from ray_jobs.train_grpo import train, train_openrlhf

    if cfg.grpo.backend == "openrlhf":
        code = train_openrlhf(grpo_config(cfg), policy=str(run_paths(cfg).sft), resume=resume, log=log)
        if code != 0:
            raise ServiceError(f"OpenRLHF's trainer exited with {code}; its log is above")
        return {"backend": "openrlhf", "policy": str(run_paths(cfg).grpo / "policy")}
    summary = train(grpo_config(cfg), resume=resume, log=log)
    return {"steps": summary["steps"], "policy": summary["policy"]}


RUNNERS = {"pairs": make_pairs, "index": build_index, "rm": train_rm, "sft": train_sft, "grpo": train_grpo}


def outputs(cfg: Config, stage: str) -> dict:
    paths = run_paths(cfg)
    return {"pairs": {"pairs": paths.pairs}, "index": {"index": paths.index / "manifest.json"},
            "rm": {"rm": paths.rm / "metrics.json"}, "sft": {"sft": paths.sft / "escrag_meta.json"},
            "grpo": {"policy": paths.grpo / "policy"}}[stage]


def run_pipeline(cfg: Config, until: str | None = None, log=print, on_stage=None) -> dict:
    """Run the stages in order up to ``until`` (default: all), skipping finished ones; returns each
    stage's key and whether it ran. ``on_stage(stage, summary)`` is called after each stage that ran."""
    if until is not None and until not in STAGES:
        raise UserError(f"--until {until}: unknown stage (stages: {', '.join(STAGES)})")
    if cfg.grpo.backend == "openrlhf":  # before any stage runs, not hours later at the GRPO stage
        from trainer.openrlhf.ranks import check_rank_split

        check_rank_split(cfg)
    else:  # the local backend's engine (OpenRLHF brings its own vLLM on the cluster)
        from rollout.engines.vllm_engine import check_config

        check_config(cfg)
    paths = run_paths(cfg)
    manifest, keys, report = Manifest(paths.manifest), {}, {}
    for stage in STAGES[: STAGES.index(until) + 1 if until else len(STAGES)]:
        parts = {"inputs": stage_inputs(cfg, stage), "upstream": {u: keys[u] for u in UPSTREAM[stage]}}
        keys[stage] = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]
        if manifest.done(stage, keys[stage]):
            log(f"[pipeline] {stage}: up to date (key {keys[stage]}), skipped")
            report[stage] = {"key": keys[stage], "ran": False}
            continue
        report[stage] = {"key": keys[stage], "ran": True, **_run(cfg, stage, keys[stage], manifest, log)}
        if on_stage is not None:
            on_stage(stage, report[stage])
    return report


def _run(cfg: Config, stage: str, key: str, manifest: Manifest, log) -> dict:
    resume = stage == "grpo" and manifest.running(stage, key)
    if stage == "grpo" and not resume and run_paths(cfg).grpo.exists():
        log(f"[pipeline] grpo: config changed since {run_paths(cfg).grpo} was written; starting over")
        shutil.rmtree(run_paths(cfg).grpo)
    manifest.record(stage, key, "running", {})
    t0 = time.time()
    log(f"[pipeline] {stage}: running (key {key}){' and resuming' if resume else ''}")
    summary = RUNNERS[stage](cfg, log=log, resume=resume) if stage == "grpo" else RUNNERS[stage](cfg, log=log)
    summary["seconds"] = round(time.time() - t0, 1)
    manifest.record(stage, key, "done", outputs(cfg, stage), summary)
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ray_jobs.pipeline", description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/cpu-demo.yaml", help="YAML preset (configs/*.yaml)")
    p.add_argument("-o", "--override", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--until", default=None, choices=STAGES, help="stop after this stage")
    args = p.parse_args(argv)
    return run_main("pipeline", lambda: run_cli(args))


def run_cli(args) -> int:
    """Handler of ``escrag pipeline`` and ``python -m ray_jobs.pipeline``."""
    report = run_pipeline(load_config(args.config, args.override), until=args.until)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
