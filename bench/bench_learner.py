"""Learner update time: this tree's ``Learner`` vs the learner before issue 27 (commit ``--baseline``),
the same batch, one run.

    .venv/bin/python bench/bench_learner.py                           # SmolLM2-135M + LoRA r16, demo config
    .venv/bin/python bench/bench_learner.py --dtype float32           # float32 on both sides
    .venv/bin/python bench/bench_learner.py --model tiny-random:qwen2 --steps 1   # smoke

The batch is the demo's (configs/cpu-demo.yaml: ``--states`` states x ``rollout.group_size`` 4 samples,
LoRA r16, KL to the adapter-off reference, micro-batches of 4): each sequence is the two-stage shape
``p1 + ĉ + feedback + c`` of ``rollout.episode.record`` with p1 the real stage-1 prompt of an ESConv
train state, and ĉ, feedback and c synthetic token ids (seeded) of ``--stage1``, ``--feedback`` and
``--stage2`` tokens (the demo's 96-token stages; ĉ and c trained, the feedback masked). The update's
cost does not depend on which tokens they are.

The baseline is the learner as it was when the issue was filed: ``git archive`` of ``--baseline``'s
``escrag``, ``trainer``, ``rollout`` and ``configs`` into ``bench/.cache/learner-<commit>`` (needs the
repository's history), run in a subprocess with that tree first on ``sys.path``; this tree's side runs
the same way. Both get the same groups (written once, as JSON, by this tree) and the same config
overrides; each makes ``--warmup`` then ``--steps`` optimizer steps, and the median is reported.
Writes ``bench/results/learner.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASELINE = "6d2b561^"  # the learner before grpo.share_prompt, the first change made for issue 27


def make_groups(cfg, tok, a) -> tuple[list[dict], int]:
    """The batch as plain data: one dict per group (state id, then samples of ids, mask, behaviour
    log-probs, action ranges and reward), and the prompt length."""
    from escrag.data import load_states
    from rollout.episode import prompt_ids, stage1_messages

    rng, groups = random.Random(0), []
    for i, state in enumerate(load_states("train")[: a.states * 10: 10]):
        p1 = prompt_ids(tok, stage1_messages(state.history, cfg))
        samples = []
        for j in range(cfg.rollout.group_size):
            ids, mask = list(p1), [0] * len(p1)
            for n, m in [(a.stage1, 1), (a.feedback, 0), (a.stage2, 1)]:
                ids += [rng.randrange(100, tok.vocab_size) for _ in range(n)]
                mask += [m] * n
            samples.append({"ids": ids, "mask": mask, "old": [-2.0 * m for m in mask],
                            "ranges": [(len(p1), len(p1) + a.stage1)], "reward": float(j == i % 4)})
        groups.append({"id": f"s/{i}", "samples": samples})
    return groups, len(p1)


def worker(spec_path: str) -> None:
    """One side, in the tree first on ``sys.path``: build its Learner, time its steps, print JSON."""
    spec = json.loads(Path(spec_path).read_text())
    import torch

    import trainer.learner as mod
    from escrag.config import load_config
    from escrag.records import Sample, ScoredGroup, TokenSequence

    if not Path(mod.__file__).resolve().is_relative_to(Path(spec["tree"]).resolve()):
        raise SystemExit(f"bench_learner: imported {mod.__file__}, not the tree {spec['tree']}")
    learner = mod.Learner(load_config(str(Path(spec["tree"]) / spec["config"]), spec["overrides"]))
    groups = [ScoredGroup(g["id"], [Sample(TokenSequence(s["ids"], s["mask"], s["old"], s["ranges"]), output="",
                                           reward=s["reward"]) for s in g["samples"]], 0)
              for g in spec["groups"]]
    times = []
    for step in range(spec["warmup"] + spec["steps"]):
        t0 = time.perf_counter()
        learner.step(groups)
        times.append(time.perf_counter() - t0)
        print(f"[{spec['name']}] step {step}: {times[-1]:.2f} s", file=sys.stderr, flush=True)
    print(json.dumps({"steps": times[spec["warmup"]:], "threads": torch.get_num_threads()}))


def baseline_tree(ref: str) -> tuple[Path, str]:
    """The baseline's source, extracted once per commit under bench/.cache (a hidden folder: never
    read as project modules)."""
    try:
        sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", ref], check=True,
                             capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError) as e:
        raise SystemExit(f"bench_learner: cannot resolve --baseline {ref!r} (needs git and the history): {e}") from None
    tree = ROOT / "bench" / ".cache" / f"learner-{sha}"
    if not (tree / "trainer" / "learner.py").exists():
        tree.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", sha, "escrag", "trainer", "rollout", "configs"],
                                 check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree, sha


def run_side(name: str, tree: Path, spec: dict) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "spec.json"
        path.write_text(json.dumps({**spec, "name": name, "tree": str(tree)}))
        env = {**os.environ, "PYTHONPATH": str(tree)}
        proc = subprocess.run([sys.executable, __file__, "--worker", str(path)], capture_output=True, text=True,
                              env=env, cwd=str(tree))
    if proc.returncode != 0:
        raise SystemExit(f"bench_learner: the {name} side failed:\n{proc.stderr[-3000:]}")
    sys.stderr.write("".join(ln + "\n" for ln in proc.stderr.splitlines() if ln.startswith(f"[{name}]")))
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/cpu-demo.yaml", help="relative to each tree")
    p.add_argument("--model", default=None, help="default: the config's policy.model")
    p.add_argument("--dtype", default="auto", help="policy.dtype (auto: bfloat16 where it is fast, else float32)")
    p.add_argument("--baseline", default=BASELINE, help="the commit whose learner is the baseline")
    p.add_argument("--states", type=int, default=2, help="dialogue states per step (the demo's batch_states)")
    p.add_argument("--stage1", type=int, default=96)
    p.add_argument("--feedback", type=int, default=120)
    p.add_argument("--stage2", type=int, default=96)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--out", default=str(ROOT / "bench/results/learner.json"))
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        return worker(a.worker)
    sys.path.insert(0, str(ROOT))
    from escrag.config import load_config
    from escrag.models import engine_dtype, load_tokenizer

    cfg = load_config(str(ROOT / a.config), [f"policy.model={a.model}"] if a.model else [])
    dtype = engine_dtype(a.dtype, "float32", cfg.policy.device)  # auto, resolved once for both sides
    over = [f"policy.dtype={dtype}"] + ([f"policy.model={a.model}"] if a.model else [])
    groups, prompt_len = make_groups(cfg, load_tokenizer(cfg.policy.model), a)
    spec = {"config": a.config, "overrides": over, "groups": groups, "warmup": a.warmup, "steps": a.steps}
    tree, sha = baseline_tree(a.baseline)
    sides = {"before": run_side("before", tree, spec), "ours": run_side("ours", ROOT, spec)}
    med = {k: statistics.median(v["steps"]) for k, v in sides.items()}
    result = {"model": cfg.policy.model, "dtype": dtype, "threads": sides["ours"]["threads"], "baseline": sha,
              "sequences": sum(len(g["samples"]) for g in groups), "prompt_tokens": prompt_len,
              "stage1": a.stage1, "feedback": a.feedback, "stage2": a.stage2,
              "lora_r": cfg.policy.lora.r if cfg.policy.lora.enabled else 0, "kl_coef": cfg.grpo.kl_coef,
              "steps": {k: v["steps"] for k, v in sides.items()}, "median_s": med,
              "speedup": med["before"] / med["ours"]}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"learner update, {result['sequences']} sequences of {prompt_len} prompt + {a.stage1} + {a.feedback} "
          f"+ {a.stage2} tokens, {dtype}, {result['threads']} threads (median of {a.steps} after {a.warmup})")
    print(f"| learner | update s |\n|---|---|\n| before issue 27 ({sha}) | {med['before']:.2f} |\n"
          f"| this tree | {med['ours']:.2f} |\n| speedup | {result['speedup']:.2f}x |")


if __name__ == "__main__":
    from escrag.runtime import tune_process

    tune_process()
    main()
