"""Engine throughput: our transformers engine vs plain ``model.generate`` at the same dtype, one run, interleaved.

Same prompts for every variant (the stage-1 chat prompts of the first ESConv valid states, as the
rollout renders them), sampling at T 0.9, top-p 0.95, 64 new tokens per row (EOS disabled in every
variant so each row makes exactly 64 tokens), SmolLM2-135M-Instruct, batch 8 and 32:

- ``hf:<dtype>``: weights in that dtype, ``model.generate(do_sample=True, top_k=0)`` (full-vocabulary
  top-p, HF's sampler), left-padded batch, DynamicCache;
- ``eager:<dtype>``: ``HFEngine`` with ``rollout.dtype`` = dtype and compile off;
- ``compiled:<dtype>``: the same with ``rollout.compile: true``.
``<dtype>`` is float32, bfloat16 or auto (``rollout.dtype`` auto: bfloat16 on a CPU with
AMX/AVX512-BF16, else float32); a variant without one is ``hf`` float32 and ours auto (the issue-12
table). Each of ours is compared with ``hf`` at its own dtype where that ran (issue 27), else with
``hf:float32``. Ours samples with the config's ``top_k`` (64) then top-p inside it (escrag.sampling).

The weight-read bound (issue 27): a decode step reads every weight once, so at most
``bandwidth / weight bytes`` steps a second, ``batch`` tokens each. The run measures the bandwidth
right before every timed run, in the variant's process on the thread that runs it (a 256 MiB
``copy_`` on ``--threads`` threads, bytes read per second, median of 5: on this VM it moves from 17
to 33 GB/s within minutes, so one reading for the whole run misstates the bound of most runs), and
counts the model's weight bytes at each dtype (the tied embedding once: the LM head reads it whole).
The table gives each of ours as a share of that bound: the median over its runs of tok/s over
``batch x bandwidth / weight bytes`` of the same run; and ``decode``, the same for the run's decode
steps alone (the tokens they made over the seconds they took, from the engine's ``stats``). The first
counts the prefill too, which the bound does not bound: a pass over the prompts' tokens is
compute-bound (at b8 ~900 prompt tokens against 512 new ones, about a quarter of the run).

Each variant runs in its own process (each then has the process's only OpenMP pool, as a rollout
worker does: rollout/engines/hf_engine.py); runs interleave (batch x variant, ``--repeats`` rounds, one
process at a time) and the tables show medians of tokens per
wall second (the target) and per CPU second of the process (steadier on a shared machine); the prefix
cache is cleared before each run (rows of one batch may still share the system prompt's K/V).
Compile time is reported apart: the warm-up call of the compiled engine per batch size (all length
buckets of the run) minus its median run. ``--cold-compile`` (default on) points inductor's cache at
a fresh folder so that the number is a first compile; ``--no-cold-compile`` reuses the machine's cache.
Also reported: |Δ log-prob| between our bfloat16 engine and the float32 model teacher-forced on the
same tokens (what ``logp_diff`` shows when the learner recomputes π_old).

Targets: issue 12, ours compiled >= 3.5x hf generate fp32 at both batch sizes; issue 27, ours >= 3x
``generate`` at the same dtype at batch 8 and 32 in float32 and bfloat16, and >= 70% of the weight-read
bound at batch 8.
Prints a table and writes ``bench/results/bench_engine.json``.

    .venv/bin/python bench/bench_engine.py                      # full (the lead's run, machine alone)
    .venv/bin/python bench/bench_engine.py --variants hf:float32,compiled:float32,hf:bfloat16,compiled:bfloat16
    .venv/bin/python bench/bench_engine.py --batches 2 --new-tokens 8 --repeats 1 --variants hf,eager  # smoke
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

KINDS = {"hf": "hf generate", "eager": "ours eager", "compiled": "ours compiled"}
SHORT = {"float32": "fp32", "bfloat16": "bf16", "auto": "auto"}


def split_variant(name: str) -> tuple[str, str]:
    """``kind[:dtype]`` -> (kind, dtype); without a dtype hf is float32 and ours auto."""
    kind, _, dtype = name.partition(":")
    if kind not in KINDS or dtype not in ("", *SHORT):
        raise SystemExit(f"bench_engine: variant {name!r}: expected one of {sorted(KINDS)}[:float32|bfloat16|auto]")
    return kind, dtype or ("float32" if kind == "hf" else "auto")


def label(name: str) -> str:
    kind, dtype = split_variant(name)
    return f"{KINDS[kind]} {SHORT[dtype]}"


def baseline_of(name: str, names: list[str]) -> str | None:
    """The hf variant ``name`` is compared with: hf at its dtype when that ran, else hf float32."""
    kind, dtype = split_variant(name)
    same = next((n for n in names if split_variant(n) == ("hf", dtype)), None)
    return None if kind == "hf" else same or next((n for n in names if split_variant(n) == ("hf", "float32")), None)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="packaged:smollm2-135m-instruct")
    p.add_argument("--batches", default="8,32")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    p.add_argument("--variants", default="hf,eager,compiled")
    p.add_argument("--cold-compile", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "bench_engine.json"))
    return p.parse_args(argv)


def prompts(tokenizer, n: int) -> list[list[int]]:
    """Stage-1 prompt ids of the first ``n`` ESConv valid states (the demo's history cut)."""
    from escrag.config import load_config
    from escrag.data import load_states
    from rollout.episode import prompt_ids, stage1_messages

    cfg = load_config(ROOT / "configs" / "cpu-demo.yaml")
    return [prompt_ids(tokenizer, stage1_messages(s.history, cfg)) for s in load_states("valid")[:n]]


class HFGenerate:
    """Plain ``model.generate`` with HF's sampler, weights in ``dtype`` (the baseline)."""

    def __init__(self, spec: str, args, dtype: str):
        from escrag.models import load_causal_lm, load_tokenizer

        self.tokenizer = load_tokenizer(spec)
        self.model = load_causal_lm(spec, dtype).eval()
        self.args = args

    def run(self, batch: list[list[int]]) -> int:
        import torch

        enc = self.tokenizer.pad({"input_ids": batch}, return_tensors="pt")  # left padding
        with torch.inference_mode():
            out = self.model.generate(**enc, do_sample=True, temperature=0.9, top_p=0.95, top_k=0,
                                      max_new_tokens=self.args.new_tokens,
                                      min_new_tokens=self.args.new_tokens,
                                      pad_token_id=self.tokenizer.pad_token_id)
        return (out.shape[1] - enc["input_ids"].shape[1]) * len(batch)


class Ours:
    """``HFEngine`` built by ``make_engine`` from the default config (+ compile on/off)."""

    def __init__(self, spec: str, args, compile_: bool, max_batch: int, max_seq_len: int, dtype: str):
        from escrag.config import load_config
        from rollout.engines import make_engine
        from rollout.engines.base import SamplingParams

        cfg = load_config(None, [f"policy.model={spec}", f"rollout.compile={str(compile_).lower()}", f"rollout.dtype={dtype}",
                                 f"rollout.max_batch={max_batch}", f"rollout.max_seq_len={max_seq_len}"])
        self.engine = make_engine(cfg)
        self.engine.eos_ids = set()  # every row makes exactly --new-tokens tokens, as in the baseline
        self.params = SamplingParams.from_config(cfg.rollout, 2, max_new_tokens=args.new_tokens, stop_strings=())
        self.seed = 0

    def run(self, batch: list[list[int]]) -> int:
        self.engine.call(self.engine.prefix_cache.clear)
        self.seed += len(batch)
        before = dict(self.engine.stats)
        gens = self.engine.generate(batch, self.params, list(range(self.seed, self.seed + len(batch))))
        self.last = gens
        # the run's split: seconds in prefill passes and in decode steps, and the tokens the steps made
        self.phase = {k: self.engine.stats[k] - before[k] for k in ("prefill_s", "decode_s", "decode_rows")}
        return sum(len(g.token_ids) for g in gens)


def copy_bandwidth() -> float:
    """Bytes read per second by a 256 MiB ``copy_`` (median of 5 after one warm-up) on this thread's
    torch threads."""
    import torch

    src, dst = torch.ones(1 << 26), torch.empty(1 << 26)
    times = []
    for _ in range(6):
        t = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - t)
    return src.numel() * 4 / statistics.median(times[1:])


def timed(fn, batch, call) -> dict:
    """Wall time, and this process's CPU time (all its threads): on a shared machine tokens per CPU
    second compare variants more stably than tokens per wall second. The copy bandwidth is read just
    before, on the thread that runs ``fn`` (``call``)."""
    bandwidth = call(copy_bandwidth)
    load = os.getloadavg()[0]
    t, c = time.perf_counter(), time.process_time()
    tokens = fn(batch)
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    return {"tokens": tokens, "seconds": wall, "tok_s": tokens / wall, "cpu_s": cpu, "tok_cpu_s": tokens / cpu,
            "load1": load, "bandwidth_bytes_s": bandwidth}


def logprob_gap(ours: Ours, spec: str, batch: list[list[int]]) -> dict:
    """|Δ log-prob| of ours (its dtype) vs the float32 model teacher-forced on the same tokens."""
    import torch

    from escrag.models import load_causal_lm
    from escrag.sampling import token_logprobs

    teacher = load_causal_lm(spec, "float32").eval()
    gaps = []
    for prompt, gen in zip(batch, ours.last):
        ids = torch.tensor([prompt + gen.token_ids])
        with torch.inference_mode():
            logits = teacher(ids).logits[0, len(prompt) - 1:-1]
        ref = token_logprobs(logits, torch.tensor(gen.token_ids), 0.9)
        gaps.append((torch.tensor(gen.logprobs) - ref).abs())
    g = torch.cat(gaps)
    return {"dtype": ours.engine.dtype, "mean": g.mean().item(), "max": g.max().item(), "tokens": len(g)}


def serve_variant(name: str, args, ids: list[list[int]], max_seq: int, conn) -> None:
    """One variant in its own process, so that each has the process's only OpenMP pool (two threads
    running parallel ops in one process slow both: rollout/engines/hf_engine.py). Ours runs on its engine
    thread, the baseline on this process's main thread. Answers ("run", b) and ("gap", b)."""
    import torch

    torch.set_num_threads(args.threads)
    kind, dtype = split_variant(name)
    if kind == "hf":
        runner = HFGenerate(args.model, args, dtype)
        call = lambda fn, *a: fn(*a)  # noqa: E731
    else:
        runner = Ours(args.model, args, kind == "compiled", max(int(b) for b in args.batches.split(",")), max_seq,
                      dtype)
        call = runner.engine.call
    conn.send("ready")
    while (msg := conn.recv()) is not None:
        kind, b = msg
        if kind == "run":
            conn.send({**timed(runner.run, ids[:b], call), **getattr(runner, "phase", {})})
        else:
            conn.send(call(logprob_gap, runner, args.model, ids[:b]))


def measure(args) -> dict:
    import multiprocessing as mp

    from escrag.models import load_tokenizer

    batches = [int(b) for b in args.batches.split(",")]
    names = [v for v in args.variants.split(",") if v]
    for name in names:  # a bad name is named here, before any variant's process starts
        split_variant(name)
    ids = prompts(load_tokenizer(args.model), max(batches))
    max_seq = max(len(p) for p in ids) + args.new_tokens + 1
    ctx, procs, conns = mp.get_context("spawn"), [], {}
    for name in names:  # one process per variant; they take turns, never run at once
        parent, child = ctx.Pipe()
        procs.append(ctx.Process(target=serve_variant, args=(name, args, ids, max_seq, child), daemon=True))
        procs[-1].start()
        assert parent.recv() == "ready"
        conns[name] = parent

    def ask(name, kind, b):
        conns[name].send((kind, b))
        return conns[name].recv()

    try:
        warm = {}
        for name in names:  # warm-up: first calls (and compiles) are not in the table
            for b in batches:
                warm[f"{name}/b{b}"] = ask(name, "run", b)["seconds"]
                print(f"warm-up {label(name)} b{b}: {warm[f'{name}/b{b}']:.1f} s", flush=True)
        runs = {f"{n}/b{b}": [] for n in names for b in batches}
        for r in range(args.repeats):
            for b in batches:
                for name in names:
                    x = ask(name, "run", b)
                    runs[f"{name}/b{b}"].append(x)
                    print(f"round {r} {label(name):<20} b{b:<3} {x['tok_s']:7.1f} tok/s, {x['tok_cpu_s']:7.1f} "
                          f"tok/cpu-s (load {x['load1']:.1f})", flush=True)
        res = {"config": vars(args), "prompt_tokens": [len(p) for p in ids], "warmup_s": warm, "runs": runs,
               "median_tok_s": {k: statistics.median(x["tok_s"] for x in v) for k, v in runs.items()},
               "median_tok_cpu_s": {k: statistics.median(x["tok_cpu_s"] for x in v) for k, v in runs.items()}}
        compiled = [n for n in names if split_variant(n)[0] == "compiled"]
        if compiled:
            res["compile_s"] = {f"{n}/b{b}": warm[f"{n}/b{b}"] - statistics.median(
                x["seconds"] for x in runs[f"{n}/b{b}"]) for n in compiled for b in batches}
        ours = [n for n in names if split_variant(n)[0] != "hf"]
        if ours:
            res["logprob_gap"] = ask(ours[-1], "gap", batches[-1])
        res["load1"] = [x["load1"] for v in runs.values() for x in v]
        return res
    finally:
        for name in names:
            conns[name].send(None)
        for proc in procs:
            proc.join(timeout=30)


def weight_read_bound(spec: str, names: list[str], runs: dict) -> dict:
    """The copy bandwidth read beside the runs (median, range), the model's weight bytes per dtype of
    the variants, and per variant and batch the median share of the bound of each run."""
    from escrag.models import engine_dtype, load_causal_lm

    params = {p.data_ptr(): p.numel() for p in load_causal_lm(spec, "float32").parameters()}  # tied: once
    bws = [x["bandwidth_bytes_s"] for v in runs.values() for x in v]
    out = {"bandwidth_bytes_s": statistics.median(bws), "bandwidth_range": [min(bws), max(bws)],
           "params": sum(params.values()), "weight_bytes": {}, "share": {}, "decode_share": {}}
    for name in names:
        kind, dtype = split_variant(name)
        dtype = engine_dtype(dtype, "float32", "cpu")
        out["weight_bytes"][dtype] = out["params"] * (4 if dtype == "float32" else 2)
        if kind == "hf":
            continue
        for key in (k for k in runs if k.startswith(name + "/b")):
            b = int(key.rsplit("/b", 1)[1])
            bound = [b * x["bandwidth_bytes_s"] / out["weight_bytes"][dtype] for x in runs[key]]  # tok/s
            out["share"][key] = statistics.median(x["tok_s"] / y for x, y in zip(runs[key], bound))
            out["decode_share"][key] = statistics.median(  # the decode steps alone: what the bound bounds
                x["decode_rows"] / x["decode_s"] / y for x, y in zip(runs[key], bound))
    return out


def print_table(res: dict) -> None:
    batches = res["config"]["batches"].split(",")
    names = [n for n in res["config"]["variants"].split(",") if n]
    for key, unit in (("median_tok_s", "tok/s"), ("median_tok_cpu_s", "tok/cpu-s")):
        med = res[key]
        print(f"\n{'variant':<22}" + "".join(f"{'b' + b + ' ' + unit:>16}{'x hf':>7}" for b in batches)
              + (f"{'b' + batches[0] + ' of bound':>14}{'decode':>8}" if key == "median_tok_s" else ""))
        for n in names:
            row, base = f"{label(n):<22}", baseline_of(n, names)
            for b in batches:
                v, ref = med[f"{n}/b{b}"], med.get(f"{base}/b{b}") if base else None
                row += f"{v:>16.1f}" + (f"{v / ref:>7.2f}" if ref else f"{'':>7}")
            bd = res.get("bound", {}) if key == "median_tok_s" else {}
            share, dec = (bd.get(k, {}).get(f"{n}/b{batches[0]}") for k in ("share", "decode_share"))
            print(row + (f"{share:>13.0%}{dec:>8.0%}" if share is not None else ""))
    if "bound" in res:
        bd = res["bound"]
        lo, hi = bd["bandwidth_range"]
        print(f"weight-read bound, read before each run: copy bandwidth median {bd['bandwidth_bytes_s'] / 1e9:.1f} "
              f"GB/s ({lo / 1e9:.1f}-{hi / 1e9:.1f}); " + ", ".join(
                  f"{d} {w / 1e6:.0f} MB a step" for d, w in bd["weight_bytes"].items())
              + f"; {bd['params'] / 1e6:.1f} M parameters, tied once; share = median over runs of tok/s over "
              "batch x bandwidth / weight bytes of that run; decode: the same for the run's decode steps alone "
              "(tokens they made over their seconds; the prefill, compute-bound, left out)")
    if "compile_s" in res:
        print("compile time (warm-up minus median run): " +
              ", ".join(f"{k} {v:.0f} s" for k, v in res["compile_s"].items()) +
              (" (cold inductor cache)" if res["config"]["cold_compile"] else " (warm inductor cache)"))
    if "logprob_gap" in res:
        g = res["logprob_gap"]
        print(f"|Δ log-prob| {g['dtype']} engine vs float32 teacher: mean {g['mean']:.4f}, max {g['max']:.4f} "
              f"over {g['tokens']} tokens")
    loads = res["load1"]
    print(f"1-min load average during the runs: {min(loads):.1f}-{max(loads):.1f} on {os.cpu_count()} CPUs")


def main(argv=None) -> int:
    from escrag.atomic import write_json

    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-engine-inductor-") as tmp:
        if args.cold_compile:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = tmp  # read when inductor first compiles
        res = measure(args)
    res["bound"] = weight_read_bound(args.model, [n for n in args.variants.split(",") if n], res["runs"])
    print_table(res)
    print(f"wrote {write_json(args.out, res)}")
    return 0


if __name__ == "__main__":
    from escrag.runtime import tune_process

    tune_process()
    sys.exit(main())
