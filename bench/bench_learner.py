"""Learner update time: the group's prompt once (``grpo.share_prompt``, ours) vs every sequence in full
(the path before issue 27), the same batch, interleaved in one run.

    .venv/bin/python bench/bench_learner.py                           # SmolLM2-135M + LoRA r16, demo config
    .venv/bin/python bench/bench_learner.py --dtype bfloat16          # bf16 autocast on both sides
    .venv/bin/python bench/bench_learner.py --model tiny-random:qwen2 --steps 1   # smoke

The batch is the demo's (configs/cpu-demo.yaml: ``--states`` states x ``rollout.group_size`` 4 samples,
LoRA r16, KL to the adapter-off reference, micro-batches of 4): each sequence is the two-stage shape
``p1 + ĉ + feedback + c`` of ``rollout.episode.record`` with p1 the real stage-1 prompt of an ESConv
train state, and ĉ, feedback and c synthetic token ids (seeded) of ``--stage1``, ``--feedback`` and
``--stage2`` tokens (the demo's 96-token stages; ĉ and c trained, the feedback masked). The update's
cost does not depend on which tokens they are. Each side makes ``--warmup`` then ``--steps`` optimizer
steps, alternating; the median is reported. Writes ``bench/results/learner.json``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def make_groups(cfg, tok, a):
    from escrag.data import load_states
    from escrag.records import Sample, ScoredGroup, TokenSequence
    from rollout.episode import prompt_ids, stage1_messages

    rng, groups = random.Random(0), []
    for i, state in enumerate(load_states("train")[: a.states * 10: 10]):
        p1 = prompt_ids(tok, stage1_messages(state.history, cfg))
        samples = []
        for j in range(cfg.rollout.group_size):
            parts = [(a.stage1, 1), (a.feedback, 0), (a.stage2, 1)]
            ids, mask = list(p1), [0] * len(p1)
            for n, m in parts:
                ids += [rng.randrange(100, tok.vocab_size) for _ in range(n)]
                mask += [m] * n
            seq = TokenSequence(ids, mask, [-2.0 * m for m in mask], [(len(p1), len(p1) + a.stage1)])
            samples.append(Sample(seq, output="", reward=float(j == i % 4)))
        groups.append(ScoredGroup(f"s/{i}", samples, 0))
    return groups, len(p1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default=str(ROOT / "configs/cpu-demo.yaml"))
    p.add_argument("--model", default=None, help="default: the config's policy.model")
    p.add_argument("--dtype", default="auto", help="policy.dtype (auto: float32 where bf16 is emulated)")
    p.add_argument("--states", type=int, default=2, help="dialogue states per step (the demo's batch_states)")
    p.add_argument("--stage1", type=int, default=96)
    p.add_argument("--feedback", type=int, default=120)
    p.add_argument("--stage2", type=int, default=96)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--out", default=str(ROOT / "bench/results/learner.json"))
    a = p.parse_args()

    import torch

    from escrag.config import load_config
    from escrag.models import torch_dtype
    from trainer.learner import Learner

    over = [f"policy.dtype={a.dtype}"] + ([f"policy.model={a.model}"] if a.model else [])
    learners = {name: Learner(load_config(a.config, [*over, f"grpo.share_prompt={flag}"]))
                for name, flag in (("full", "false"), ("shared", "true"))}
    cfg = learners["shared"].cfg
    groups, prompt_len = make_groups(cfg, learners["shared"].tokenizer, a)
    times: dict[str, list[float]] = {k: [] for k in learners}
    for step in range(a.warmup + a.steps):
        for name, learner in learners.items():
            t0 = time.perf_counter()
            learner.step(groups)
            dt = time.perf_counter() - t0
            if step >= a.warmup:
                times[name].append(dt)
            print(f"[{name}] step {step}: {dt:.2f} s", file=sys.stderr, flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    result = {"model": cfg.policy.model, "dtype": str(torch_dtype(cfg.policy.dtype)).removeprefix("torch."),
              "threads": torch.get_num_threads(), "sequences": len(groups) * cfg.rollout.group_size,
              "prompt_tokens": prompt_len, "stage1": a.stage1, "feedback": a.feedback, "stage2": a.stage2,
              "lora_r": cfg.policy.lora.r if cfg.policy.lora.enabled else 0, "kl_coef": cfg.grpo.kl_coef,
              "steps": times, "median_s": med, "speedup": med["full"] / med["shared"]}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"learner update, {result['sequences']} sequences of {prompt_len} prompt + {a.stage1} + {a.feedback} "
          f"+ {a.stage2} tokens, {result['dtype']}, {result['threads']} threads (median of {a.steps})")
    print(f"| path | update s |\n|---|---|\n| every sequence in full (before) | {med['full']:.2f} |\n"
          f"| group prompt once (grpo.share_prompt) | {med['shared']:.2f} |\n"
          f"| speedup | {result['speedup']:.2f}x |")


if __name__ == "__main__":
    main()
