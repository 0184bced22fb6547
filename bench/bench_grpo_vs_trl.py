"""Vanilla GRPO step time: our learner + transformers engine vs TRL's GRPOTrainer, same settings.

    .venv/bin/python bench/bench_grpo_vs_trl.py                       # SmolLM2-135M + LoRA r=16
    .venv/bin/python bench/bench_grpo_vs_trl.py --model tiny-random:qwen2 --lora 0 --steps 2  # smoke

One step, both sides: generate ``--group`` completions for each of ``--prompts`` prompts (sampling
at temperature 0.9, top-p 0.95, at most ``--completion-len`` new tokens), score them with the same
rule reward (share of vowels among letters; no retrieval, no reward server), and make one optimizer
step over the 16 completions in micro-batches of ``--micro`` with KL coefficient ``--kl`` to the
reference (LoRA: adapter disabled). Prompts are ESConv stage-1 prompts cut to their last
``--prompt-len`` tokens. Ours also pushes the new weights into its generation engine (TRL generates
with the model it trains, so it has no push). The median over ``--steps`` steps after ``--warmup``
is reported (``step_s``; every step's time is kept), with the completion tokens each side actually generated (EOS may end one early).

TRL runs in its own environment, never in .venv: ``bench/.cache/venv-trl`` (created on first use:
a venv that sees .venv's packages through a .pth file, plus ``trl==1.16.0`` installed into it), as a
subprocess running this file with ``--trl-worker``. ``--dtype bfloat16`` (default) trains with
bfloat16 autocast over float32 weights on both sides (ours: ``policy.dtype``; TRL: ``bf16=True``). TRL's gradient checkpointing (on by default) is
turned off unless ``--trl-grad-ckpt``: we do not checkpoint either.

Writes ``bench/results/grpo_vs_trl.json`` and prints a table with both times and the ratio.

``--kinds native,avx2`` runs the whole comparison once per CPU kind, each in a process of its own, and
writes both into one JSON (``kinds``: the CPU class, dtype, both sides and the ratio of each): ``native``
as this CPU is, in bfloat16 where it is fast (``escrag.models.fast_bfloat16``) else float32, and
``avx2`` with ``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2`` (torch's and oneDNN's AVX2 kernels,
TRL's process included) in float32, the path an AVX2-only CPU takes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRL_VENV = ROOT / "bench" / ".cache" / "venv-trl"
TRL_PIN = "trl==1.16.0"


def vowel_reward(text: str) -> float:
    letters = [c for c in text.lower() if c.isalpha()]
    return sum(c in "aeiou" for c in letters) / max(len(letters), 1)


# ------------------------------------------------------------------------------------------ prompts


def make_prompts(model_path: str, n: int, prompt_len: int) -> list[str]:
    sys.path.insert(0, str(ROOT))
    from escrag.data import load_states
    from escrag.models import load_tokenizer
    from escrag.prompts import render, stage1_messages

    tok = load_tokenizer(model_path)
    prompts = []
    for s in load_states("train")[: n * 10: 10]:
        ids = tok(render(tok, stage1_messages(s.history)), add_special_tokens=False).input_ids
        prompts.append(tok.decode(ids[-prompt_len:]))
    return prompts


# ------------------------------------------------------------------------------------------ ours


def run_ours(a, model_path: str, prompts: list[str]) -> dict:
    import torch

    from escrag.config import load_config
    from escrag.records import Sample, ScoredGroup
    from rollout.engines import make_engine
    from rollout.engines.base import SamplingParams
    from rollout.episode import record
    from trainer.learner import Learner

    over = [f"policy.model={model_path}", f"policy.lora.enabled={str(a.lora > 0).lower()}",
            f"policy.lora.r={max(a.lora, 1)}", f"policy.lora.alpha={2 * max(a.lora, 1)}",
            f"grpo.micro_batch_size={a.micro}", f"grpo.kl_coef={a.kl}", "grpo.lr=1e-6", f"policy.dtype={a.dtype}"]
    cfg = load_config(None, over)
    torch.manual_seed(0)
    engine, learner = make_engine(cfg, model_path, seed=0), Learner(cfg)
    tok = engine.tokenizer
    ids = [tok(p, add_special_tokens=False).input_ids for p in prompts]
    params = SamplingParams.from_config(cfg.rollout, 2, max_new_tokens=a.completion_len, stop_strings=())
    times, tokens = [], []
    for step in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        gens = engine.generate([p for p in ids for _ in range(a.group)], params)
        groups = []
        for i, p in enumerate(ids):
            chunk = gens[i * a.group:(i + 1) * a.group]
            samples = [Sample(record(p, g, None, None, True), g.text, reward=vowel_reward(g.text)) for g in chunk]
            groups.append(ScoredGroup(str(i), samples, engine.version))
        m = learner.step(groups)
        if m["optimizer_steps"]:
            engine.load_weights(learner.export_weights(), learner.version)
        if step >= a.warmup:
            times.append(time.perf_counter() - t0)
            tokens.append(sum(len(g.token_ids) for g in gens))
        print(f"[ours] step {step}: {time.perf_counter() - t0:.2f} s", file=sys.stderr, flush=True)
    return {"step_s": statistics.median(times), "steps": times, "completion_tokens": sum(tokens) / len(tokens)}


# ------------------------------------------------------------------------------------------ TRL


def ensure_trl_venv() -> Path:
    py = TRL_VENV / "bin" / "python"
    if py.exists() and subprocess.run([py, "-c", "import trl"], capture_output=True).returncode == 0:
        return py
    print(f"creating {TRL_VENV} with {TRL_PIN} (once) ...", file=sys.stderr, flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(TRL_VENV)], check=True)  # on the base interpreter
    import site

    pth = TRL_VENV / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    (pth / "escrag-main-venv.pth").write_text(site.getsitepackages()[0] + "\n")  # torch etc. from .venv
    subprocess.run([py, "-m", "pip", "install", "-q", TRL_PIN], check=True)
    return py


def run_trl(a, model_path: str, prompts: list[str]) -> dict:
    py = ensure_trl_venv()
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "spec.json"
        spec.write_text(json.dumps({"model": model_path, "prompts": prompts, "args": vars(a), "out": tmp}))
        proc = subprocess.run([py, __file__, "--trl-worker", str(spec)], capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": ""})
        if proc.returncode != 0:
            raise RuntimeError(f"TRL worker failed:\n{proc.stderr[-4000:]}")
        return json.loads(proc.stdout.strip().splitlines()[-1])


def trl_worker(spec_path: str) -> None:
    """Runs inside the TRL venv: one GRPOTrainer run, prints a JSON line with the step times."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    spec = json.loads(Path(spec_path).read_text())
    a = spec["args"]
    torch.manual_seed(0)

    class Timer(TrainerCallback):
        def __init__(self):
            self.times, self.lengths, self._t = [], [], 0.0

        def on_step_begin(self, args, state, control, **kw):
            self._t = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            self.times.append(time.perf_counter() - self._t)
            print(f"[trl] step {len(self.times) - 1}: {self.times[-1]:.2f} s", file=sys.stderr, flush=True)

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "completions/mean_length" in logs:
                self.lengths.append(logs["completions/mean_length"])

    def reward(prompts, completions, **kw):
        return [vowel_reward(c) for c in completions]

    n_steps = a["warmup"] + a["steps"]
    data = Dataset.from_dict({"prompt": spec["prompts"] * (n_steps + 1)})
    cfg = GRPOConfig(output_dir=spec["out"], per_device_train_batch_size=a["micro"],
                     gradient_accumulation_steps=a["prompts"] * a["group"] // a["micro"],
                     num_generations=a["group"], max_completion_length=a["completion_len"], temperature=0.9,
                     top_p=0.95, beta=a["kl"], learning_rate=1e-6, max_steps=n_steps, logging_steps=1,
                     report_to="none", save_strategy="no", use_cpu=True, bf16=a["dtype"] == "bfloat16",
                     gradient_checkpointing=a["trl_grad_ckpt"], shuffle_dataset=False, seed=0)
    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(spec["model"])
    tok.padding_side = "left"
    peft_config = None
    if a["lora"] > 0:
        from peft import LoraConfig

        peft_config = LoraConfig(r=a["lora"], lora_alpha=2 * a["lora"], task_type="CAUSAL_LM",
                                 target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    timer = Timer()
    trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=cfg, train_dataset=data,
                          processing_class=tok, peft_config=peft_config, callbacks=[timer])
    trainer.train()
    times = timer.times[a["warmup"]:]
    lengths = timer.lengths[a["warmup"]:] or [float("nan")]
    print(json.dumps({"step_s": statistics.median(times), "steps": times,
                      "completion_tokens": sum(lengths) / len(lengths) * a["prompts"] * a["group"]}))


# ------------------------------------------------------------------------------------------ driver

KIND_ENV = {"native": {}, "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}}


def run_kinds(a, argv: list[str]) -> int:
    """This script once per kind of ``--kinds`` in a process under that kind's environment, its dtype
    the one the project's ``auto`` picks there; the reports go into one JSON at ``--out``."""
    from escrag.atomic import write_json

    keep = [x for i, x in enumerate(argv) if not x.startswith(("--kinds", "--out", "--dtype"))
            and not (i and argv[i - 1] in ("--kinds", "--out", "--dtype"))]
    kinds = {}
    for kind in a.kinds.split(","):
        env = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")}
        env.update(KIND_ENV[kind])
        probe = "from escrag.models import cpu_class, resolve_auto_dtype as r; print(cpu_class(), r('auto', 'cpu'))"
        cpu, dtype = subprocess.run([sys.executable, "-c", probe], env=env, cwd=ROOT, capture_output=True,
                                    text=True, check=True).stdout.split()
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "kind.json"
            subprocess.run([sys.executable, __file__, *keep, "--dtype", dtype, "--out", str(out)], env=env, check=True)
            kinds[kind] = {"cpu_class": cpu, "env": KIND_ENV[kind], **json.loads(out.read_text())}
    from bench_engine import machine  # noqa: E402  (bench/ is on sys.path as this script's folder)

    path = write_json(a.out, {**machine(), "kinds": kinds})
    print(f"wrote {path}: " + ", ".join(f"{k} ({v['cpu_class']}, {v['settings']['dtype']}) ours/TRL "
                                         f"{v.get('ratio_ours_over_trl', float('nan')):.2f}" for k, v in kinds.items()))
    return 0



def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="packaged:smollm2-135m-instruct")
    p.add_argument("--lora", type=int, default=16, help="LoRA rank; 0: full fine-tuning")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--group", type=int, default=4)
    p.add_argument("--micro", type=int, default=4, help="completions per micro-batch")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--completion-len", type=int, default=64)
    p.add_argument("--kl", type=float, default=0.05)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--only", choices=("both", "ours", "trl"), default="both")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="bfloat16",
                   help="learner compute dtype on both sides (autocast, float32 weights); our engine's "
                        "weights follow rollout.dtype (auto: bfloat16 where fast), TRL generates with the model")
    p.add_argument("--trl-grad-ckpt", action="store_true", help="keep TRL's gradient checkpointing on")
    p.add_argument("--kinds", default=None, help="comma-separated CPU kinds, native and/or avx2: one run each, "
                                                    "one JSON (--dtype is chosen per kind)")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "grpo_vs_trl.json"))
    p.add_argument("--trl-worker", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv=None) -> int:
    a = parse(argv)
    if a.trl_worker:
        trl_worker(a.trl_worker)
        return 0
    sys.path.insert(0, str(ROOT))
    from escrag.atomic import write_json
    from escrag.models import resolve_model
    from escrag.runtime import tune_process

    tune_process()  # after the TRL worker's branch: it inherits the spin count, as before, not our allocator
    if a.kinds:
        return run_kinds(a, argv or sys.argv[1:])

    model_path = resolve_model(a.model)
    prompts = make_prompts(model_path, a.prompts, a.prompt_len)
    results = {}
    if a.only in ("both", "ours"):
        results["ours"] = run_ours(a, model_path, prompts)
    if a.only in ("both", "trl"):
        results["trl"] = run_trl(a, model_path, prompts)
    report = {"settings": {k: v for k, v in vars(a).items() if k not in ("out", "trl_worker")}, **results}
    if "ours" in results and "trl" in results:
        report["ratio_ours_over_trl"] = results["ours"]["step_s"] / results["trl"]["step_s"]
    print(f"\nvanilla GRPO step, {a.model} ({f'LoRA r={a.lora}' if a.lora else 'full'}), "
          f"{a.prompts} prompts x {a.group}, prompt {a.prompt_len} / completion <= {a.completion_len} tokens")
    print(f"{'':6} {'s/step':>8} {'tokens/step':>12}")
    for name, r in results.items():
        print(f"{name:6} {r['step_s']:8.2f} {r['completion_tokens']:12.0f}")
    if "ratio_ours_over_trl" in report:
        print(f"ratio ours/TRL: {report['ratio_ours_over_trl']:.2f}x (issue 27: <= 0.35x)")
    out = write_json(a.out, report)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
