"""Streaming learner: step wall time and samples/s of the GRPO job's loop at ``grpo.max_staleness`` 0
(rollouts wait for each update) and 1 (the next step's rollouts run during the update), side by side in
one run, on the demo config (SmolLM2-135M + LoRA r=16, two-stage RAG rollouts).

Each variant runs ``trainer.loop.fit`` with a fresh learner actor and rollout pool (model loads
are not timed) against the same live retriever (an ESConv index of ``--index-limit`` chunks) and rule
reward server. A variant is ``K`` or ``K:T`` (T torch threads for the rollout worker and for the
learner, instead of the config's). Step 1 fills the pipeline and warms the caches; the table shows the
median of the later steps' wall time (``step_s``: end of one step to the end of the next) and
samples/s over them, plus the mean time the driver waited for rollouts (``wait_s``), the longest
worker call (``gen_s``) and the update (``update_s``).

Run (the lead's rerun, alone on the machine):
  .venv/bin/python bench/bench_streaming.py
Smoke run (tiny model, a minute):
  .venv/bin/python bench/bench_streaming.py --model tiny-random:qwen2 --steps 3 --index-limit 40 --lora 0
Writes bench/results/bench_streaming.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from escrag.atomic import write_json  # noqa: E402
from escrag.web.procs import ServerProcess  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/cpu-demo.yaml")
    p.add_argument("--model", default=None, help="policy spec (default: the config's policy.model)")
    p.add_argument("--lora", type=int, default=None, help="0: full fine-tuning (default: the config's)")
    p.add_argument("--steps", type=int, default=5, help="GRPO steps per variant (the first is not counted)")
    p.add_argument("--variants", default="0,1,1:1", help="comma-separated K or K:THREADS")
    p.add_argument("--index-limit", type=int, default=500, help="chunks in the benchmark index")
    p.add_argument("--reward", default="vowels", help="rule served by the reward server")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "bench_streaming.json"))
    return p.parse_args(argv)


def variant_config(args, k: int, threads: int | None, urls: dict, out: Path):
    from escrag.config import load_config

    over = [f"run.output_dir={out}", f"retriever.url={urls['retriever']}", f"reward.url={urls['reward']}",
            f"grpo.steps={args.steps}", f"grpo.max_staleness={k}", "grpo.tensorboard=false",
            "grpo.checkpoint_every=100000", "grpo.log_samples=false"]
    if args.model:
        over.append(f"policy.model={args.model}")
    if args.lora is not None:
        over.append(f"policy.lora.enabled={bool(args.lora)}")
    if threads:
        over += [f"rollout.torch_threads={threads}", f"grpo.learner_torch_threads={threads}"]
    return load_config(ROOT / args.config, over)


def run_variant(cfg, gpus: float) -> list[dict]:
    import ray

    from rollout.pool import RolloutPool
    from trainer.learner import place, start_learner
    from trainer.loop import fit, train_states
    from trainer.metrics import read_metrics

    cfg = place(cfg, gpus)
    learner = start_learner(cfg)
    pool = RolloutPool(cfg, cfg.retriever.url, cfg.reward.url)
    try:
        ray.get(learner.describe.remote())
        pool.versions()  # both loaded: model loads are not timed
        summary = fit(cfg, pool, learner, train_states(cfg), log=lambda *_: None)
    finally:
        pool.shutdown()
        ray.kill(learner)
    return read_metrics(summary["metrics"])


def summarise(name: str, k: int, threads, rows: list[dict]) -> dict:
    later = rows[1:] or rows
    samples = sum(r["samples_per_s"] * r["step_s"] for r in later)
    mean = lambda key: statistics.fmean(r[key] for r in later)  # noqa: E731
    return {"variant": name, "max_staleness": k, "threads": threads, "steps_counted": len(later),
            "step_s_median": statistics.median(r["step_s"] for r in later), "first_step_s": rows[0]["step_s"],
            "samples_per_s": samples / sum(r["step_s"] for r in later), "wait_s_mean": mean("wait_s"),
            "gen_s_mean": mean("gen_s"), "update_s_mean": mean("update_s"), "push_s_mean": mean("push_s"),
            "staleness_max": max(r["staleness_max"] for r in rows), "stale_groups": sum(r["stale_groups"] for r in rows),
            "reward_mean_last": rows[-1].get("reward_mean"), "steps": rows}


def print_table(results: list[dict]) -> None:
    print(f"\n{'variant':<14}{'step s (median)':>16}{'samples/s':>11}{'wait s':>8}{'gen s':>8}{'update s':>10}"
          f"{'lag max':>9}{'dropped':>9}")
    for r in results:
        print(f"{r['variant']:<14}{r['step_s_median']:>16.2f}{r['samples_per_s']:>11.3f}{r['wait_s_mean']:>8.2f}"
              f"{r['gen_s_mean']:>8.2f}{r['update_s_mean']:>10.2f}{r['staleness_max']:>9}{r['stale_groups']:>9}")


def main(argv=None) -> int:
    args = parse_args(argv)
    import ray

    from escrag.raylocal import init_ray

    variants = [(int(v.split(":")[0]), int(v.split(":")[1]) if ":" in v else None) for v in args.variants.split(",")]
    with tempfile.TemporaryDirectory(prefix="bench-streaming-") as tmp:
        tmp = Path(tmp)
        subprocess.run([sys.executable, "-m", "escrag", "index", "build", "--source", "esconv", "--out",
                        str(tmp / "index"), "--limit", str(args.index_limit)], check=True, cwd=ROOT)
        procs = [ServerProcess("retriever", ["retriever", "--index", str(tmp / "index")], tmp, timeout=None),
                 ServerProcess("reward", ["reward", "--rule", args.reward], tmp, timeout=None)]
        try:
            urls = {p.name: p.wait(300).url for p in procs}
            probe = variant_config(args, 0, None, urls, tmp / "probe")
            init_ray(num_cpus=probe.ray.num_cpus, tmpdir=str(ROOT / ".cache" / "ray-bench"))
            gpus = ray.cluster_resources().get("GPU", 0.0)
            results = []
            for k, threads in variants:
                name = f"k={k}" + (f", {threads} thr" if threads else "")
                print(f"[bench] {name}: {args.steps} steps", flush=True)
                rows = run_variant(variant_config(args, k, threads, urls, tmp / name.replace(" ", "")), gpus)
                results.append(summarise(name, k, threads, rows))
        finally:
            for p in procs:
                p.stop()
    print_table(results)
    res = {"config": vars(args), "cpus": os.cpu_count(), "gpus": gpus, "load_avg_at_end": os.getloadavg(),
           "note": "cores shared with other work when measured unless the lead reran it alone", "results": results}
    out = write_json(args.out, json.loads(json.dumps(res, default=str)))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    from escrag.runtime import tune_process

    tune_process()
    sys.exit(main())
