"""Engine throughput: our transformers engine vs plain ``model.generate`` at the same dtype, one run, interleaved.

Same prompts for every variant (the stage-1 chat prompts of the first ESConv valid states, as the
rollout renders them), sampling at T 0.9, top-p 0.95, 64 new tokens per row (EOS disabled in every
variant so each row makes exactly 64 tokens), SmolLM2-135M-Instruct, batch 8 and 32:

- ``hf:<dtype>``: weights in that dtype, ``model.generate(do_sample=True, top_k=0)`` (full-vocabulary
  top-p, HF's sampler), left-padded batch, DynamicCache;
- ``eager:<dtype>``: ``HFEngine`` with ``rollout.dtype`` = dtype and compile off;
- ``compiled:<dtype>``: the same with ``rollout.compile: true``.
- ``vllm:<dtype>``: the project's vLLM engine (``VLLMEngine``, rollout/engines/vllm_engine.py) on vLLM's CPU
  build, run by ``--vllm-python`` (.venv-vllm, ``make install-vllm``), ``kv_cache_gb`` ``--vllm-kv-cache-gb``,
  ``enforce_eager`` unless ``--no-vllm-eager``, prefix cache reset before each run, ``ignore_eos`` set in
  its SamplingParams, top-k 64 then top-p as ours, and no per-row seed (the engine's seeded rows crash
  vLLM 0.29's CPU worker once a batch's prompts exceed ``max_num_batched_tokens``, 4,096: a chunked
  prefill rewinds the row's generator, "CPU Generator does not use offset", b32 here; unseeded, vLLM
  samples the batch at once, which only helps it); vLLM's own thread binding (``VLLM_CPU_OMP_THREADS_BIND``
  auto: on x86 it keeps one core for its engine-core process and binds the worker's OpenMP to the rest);
- ``vllm-allcores:<dtype>``: the same with ``VLLM_CPU_OMP_THREADS_BIND=0-<cores-1>`` (vLLM's documented
  knob): the worker's OpenMP on every core, the engine core and the frontend beside it.
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

Where the time goes, measured in every run of every variant (``runs``, medians in ``why``): a
1-new-token run of the same batch just before it (its prefill and first draw: ``prefill_run_s``), so
``step_ms`` = (run seconds - that) / (new tokens - 1) is a decode step's wall time measured the same way
on every side; and per process of the variant (vLLM: the frontend, ``VLLM::EngineCore`` and
``VLLM::Worker``), its CPU seconds over the run's wall seconds (cores it kept busy) and how many of its
threads ran at least a fifth of the run (busy threads), from /proc. ``threads`` records, once the variant
is built, each process's ``OMP_NUM_THREADS`` / ``OMP_PLACES`` / CPU affinity and torch's thread count;
``vllm_log`` vLLM's own log lines about its OpenMP binding and torch threads.

Each variant runs in its own process (each then has the process's only OpenMP pool, as a rollout
worker does: rollout/engines/hf_engine.py); runs interleave (batch x variant, ``--repeats`` rounds, one
process at a time) and the tables show medians of tokens per
wall second (the target) and per CPU second of the process (steadier on a shared machine); the prefix
cache is cleared before each run (rows of one batch may still share the system prompt's K/V). A variant's
process is started with its interpreter (``.venv`` for ours and ``generate``, ``--vllm-python`` for vLLM)
and talks to the run over a local socket. Warm-up: a full run per batch for the compiled engine (its
compile time is read from it), an 8-token run per batch for the others (first calls at that shape).
Compile time is reported apart: the warm-up call of the compiled engine per batch size (all length
buckets of the run) minus its median run. ``--cold-compile`` (default on) points inductor's cache at
a fresh folder so that the number is a first compile; ``--no-cold-compile`` reuses the machine's cache.
Also reported: |Δ log-prob| between our bfloat16 engine and the float32 model teacher-forced on the
same tokens (what ``logp_diff`` shows when the learner recomputes π_old).

Targets: issue 12, ours compiled >= 3.5x hf generate fp32 at both batch sizes; issue 27, ours >= 3x
``generate`` at the same dtype at batch 8 and 32 in float32 and bfloat16, and >= 70% of the weight-read
bound at batch 8.
The tok/cpu-s table counts the CPU seconds of the variant's whole process tree (vLLM's three processes).
Also: ours against each vLLM variant at the same dtype (``ratios``), the tokens each run made (every
side makes batch x new tokens: ``tokens``), the CPU (``machine``, ``cpu``) and versions (``versions``).
Prints a table and writes ``bench/results/bench_engine.json``.

    .venv/bin/python bench/bench_engine.py                      # full (the lead's run, machine alone)
    .venv/bin/python bench/bench_engine.py --variants hf:float32,compiled:float32,hf:bfloat16,compiled:bfloat16
    .venv/bin/python bench/bench_engine.py --batches 2 --new-tokens 8 --repeats 1 --variants hf,eager  # smoke
    .venv/bin/python bench/bench_engine.py --new-tokens 128 --out bench/results/bench_engine_vllm.json \
        --variants hf:float32,eager:float32,vllm:float32,vllm-allcores:float32,hf:bfloat16,eager:bfloat16,vllm:bfloat16,vllm-allcores:bfloat16
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

KINDS = {"hf": "hf generate", "eager": "ours eager", "compiled": "ours compiled", "vllm": "vLLM CPU",
         "vllm-allcores": "vLLM CPU all cores"}
VLLM_KINDS = ("vllm", "vllm-allcores")
SHORT = {"float32": "fp32", "bfloat16": "bf16", "auto": "auto"}
WARMUP_TOKENS = 8  # warm-up run of a variant that compiles nothing
BUSY = 0.2  # a thread that ran at least this share of a run's wall time counts as busy


def split_variant(name: str) -> tuple[str, str]:
    """``kind[:dtype]`` -> (kind, dtype); without a dtype hf is float32 and ours auto."""
    kind, _, dtype = name.partition(":")
    if kind not in KINDS or dtype not in ("", *SHORT) or (kind in VLLM_KINDS and dtype == "auto"):
        raise SystemExit(f"bench_engine: variant {name!r}: expected one of {sorted(KINDS)}[:float32|bfloat16|auto]"
                         " (vLLM: float32 or bfloat16)")
    return kind, dtype or ("float32" if kind in ("hf", *VLLM_KINDS) else "auto")


def label(name: str) -> str:
    kind, dtype = split_variant(name)
    return f"{KINDS[kind]} {SHORT[dtype]}"


def ours(name: str) -> bool:
    return split_variant(name)[0] in ("eager", "compiled")


def baseline_of(name: str, names: list[str], kind: str = "hf") -> str | None:
    """The ``kind`` variant ``name`` is compared with: that kind at its dtype when it ran, else (hf only) hf
    float32."""
    own, dtype = split_variant(name)
    if own in ("hf", *VLLM_KINDS):
        return None
    same = next((n for n in names if split_variant(n) == (kind, dtype)), None)
    return same or (next((n for n in names if split_variant(n) == ("hf", "float32")), None) if kind == "hf" else None)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="packaged:smollm2-135m-instruct")
    p.add_argument("--batches", default="8,32")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    p.add_argument("--variants", default="hf,eager,compiled")
    p.add_argument("--cold-compile", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--vllm-python", default=str(ROOT / ".venv-vllm" / "bin" / "python"),
                   help="the interpreter of the vLLM variants (make install-vllm)")
    p.add_argument("--vllm-kv-cache-gb", type=float, default=1.0)
    p.add_argument("--vllm-eager", action=argparse.BooleanOptionalAction, default=True,
                   help="vLLM's enforce_eager (no torch.compile)")
    p.add_argument("--by-dtype", action=argparse.BooleanOptionalAction, default=True,
                   help="the variants of one dtype at a time (interleaved), the dtypes one after another")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "bench_engine.json"))
    p.add_argument("--serve", help=argparse.SUPPRESS)  # a variant's process: the run's socket address
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

    def run(self, batch: list[list[int]], new_tokens: int) -> int:
        import torch

        enc = self.tokenizer.pad({"input_ids": batch}, return_tensors="pt")  # left padding
        with torch.inference_mode():
            out = self.model.generate(**enc, do_sample=True, temperature=0.9, top_p=0.95, top_k=0,
                                      max_new_tokens=new_tokens, min_new_tokens=new_tokens,
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
        self.engine.eos_ids = set()  # every row makes exactly the tokens asked, as in the baseline
        self.params = SamplingParams.from_config(cfg.rollout, 2, max_new_tokens=args.new_tokens, stop_strings=())
        self.seed = 0

    def run(self, batch: list[list[int]], new_tokens: int) -> int:
        import dataclasses

        self.engine.call(self.engine.prefix_cache.clear)
        self.seed += len(batch)
        before = dict(self.engine.stats)
        gens = self.engine.generate(batch, dataclasses.replace(self.params, max_new_tokens=new_tokens),
                                    list(range(self.seed, self.seed + len(batch))))
        self.last = gens
        # the run's split: seconds in prefill passes and in decode steps, and the tokens the steps made
        self.phase = {k: self.engine.stats[k] - before[k] for k in ("prefill_s", "decode_s", "decode_rows")}
        return sum(len(g.token_ids) for g in gens)


class PeerVLLM:
    """The project's ``VLLMEngine`` with the sampling of ours (T 0.9, top-k 64, top-p 0.95) and EOS ignored."""

    def __init__(self, spec: str, args, dtype: str, max_seq_len: int):
        from escrag.config import load_config
        from rollout.engines.base import SamplingParams
        from rollout.engines.vllm_engine import VLLMEngine

        class EOSIgnored(VLLMEngine):
            def _params(self, params, seed):
                sp = super()._params(params, seed)
                sp.ignore_eos = True  # read when vLLM's input processor adds the model's EOS ids
                sp.seed = None  # no per-row generator: see the module doc (vLLM's batched sampler)
                return sp

        cfg = load_config(None, [f"policy.model={spec}"])
        self.engine = EOSIgnored(spec, dtype, gpu_memory_utilization=cfg.rollout.vllm_gpu_memory,
                                 max_model_len=max_seq_len, kv_cache_gb=args.vllm_kv_cache_gb,
                                 enforce_eager=args.vllm_eager)
        self.params = SamplingParams.from_config(cfg.rollout, 2, max_new_tokens=args.new_tokens, stop_strings=())
        self.seed = 0

    def run(self, batch: list[list[int]], new_tokens: int) -> int:
        import dataclasses

        self.engine.llm.reset_prefix_cache()  # as ours clears its prefix cache: every run prefills its prompts
        self.seed += len(batch)
        gens = self.engine.generate(batch, dataclasses.replace(self.params, max_new_tokens=new_tokens),
                                    list(range(self.seed, self.seed + len(batch))))
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


# --- processes and threads, from /proc -------------------------------------------------------------

TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _read(path: str) -> str:
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return ""


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants (vLLM's engine core and worker processes)."""
    parent = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _read(f"/proc/{entry}/stat")
            if stat:
                parent[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo += [c for c, pp in parent.items() if pp == p]
    return tree


def thread_cpu(pids: list[int]) -> dict:
    """{(pid, tid): CPU seconds} of every thread of ``pids``; ``comm`` names each pid."""
    out = {}
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            stat = _read(f"/proc/{pid}/task/{tid}/stat")
            if stat:
                f = stat.rsplit(")", 1)[1].split()
                out[(pid, int(tid))] = (int(f[11]) + int(f[12])) / TICK  # utime + stime
    return out


def comm(pid: int) -> str:
    """The process's name (vLLM names its own: ``VLLM::EngineCore``, ``VLLM::Worker``); ``main`` for this one."""
    return "main" if pid == os.getpid() else _read(f"/proc/{pid}/comm").strip() or str(pid)


def by_process(before: dict, after: dict, wall: float) -> dict:
    """Per process name: CPU seconds of the run, cores kept busy (CPU / wall), busy threads and the CPUs
    they may run on."""
    out: dict[str, dict] = {}
    for (pid, tid), cpu in after.items():
        d = cpu - before.get((pid, tid), 0.0)
        p = out.setdefault(comm(pid), {"cpu_s": 0.0, "busy_threads": 0, "busy_cpus": set()})
        p["cpu_s"] += d
        if d >= BUSY * wall:
            p["busy_threads"] += 1
            try:
                p["busy_cpus"] |= os.sched_getaffinity(tid)
            except OSError:
                pass
    for p in out.values():
        p["cores"], p["busy_cpus"] = p["cpu_s"] / wall, sorted(p["busy_cpus"])
    return out


def thread_setup(pids: list[int]) -> dict:
    """What each process of the variant was told about threads: OpenMP variables, CPU affinity."""
    out = {}
    for pid in pids:
        env = dict(kv.split("=", 1) for kv in _read(f"/proc/{pid}/environ").split("\0") if "=" in kv)
        try:
            affinity = sorted(os.sched_getaffinity(pid))
        except OSError:
            affinity = None
        out[comm(pid)] = {"affinity": affinity, "threads": len(os.listdir(f"/proc/{pid}/task")),
                          **{k: env[k] for k in ("OMP_NUM_THREADS", "OMP_PLACES", "OMP_PROC_BIND",
                                                 "VLLM_CPU_OMP_THREADS_BIND", "GOMP_SPINCOUNT") if k in env}}
    return out


def timed(fn, batch, new_tokens, call) -> dict:
    """Wall time, and the CPU time of the variant's processes (all their threads): on a shared machine
    tokens per CPU second compare variants more stably than tokens per wall second. The copy bandwidth
    is read just before, on the thread that runs ``fn`` (``call``)."""
    bandwidth = call(copy_bandwidth)
    load = os.getloadavg()[0]
    pids = process_tree(os.getpid())
    before = thread_cpu(pids)
    t = time.perf_counter()
    tokens = fn(batch, new_tokens)
    wall = time.perf_counter() - t
    procs = by_process(before, thread_cpu(pids), wall)
    cpu = sum(p["cpu_s"] for p in procs.values())
    return {"tokens": tokens, "seconds": wall, "tok_s": tokens / wall, "cpu_s": cpu, "tok_cpu_s": tokens / cpu,
            "load1": load, "bandwidth_bytes_s": bandwidth, "procs": procs}


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


def versions() -> dict:
    import importlib.metadata as md
    import platform

    out = {"python": platform.python_version(), "executable": sys.executable}
    for dist in ("torch", "transformers", "vllm-cpu", "vllm"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            pass
    return out


def serve_variant(name: str, args, ids: list[list[int]], max_seq: int, conn) -> None:
    """One variant in its own process, so that each has the process's only OpenMP pool (two threads
    running parallel ops in one process slow both: rollout/engines/hf_engine.py). Ours runs on its engine
    thread, the baseline and vLLM's frontend on this process's main thread. Answers ("run", b, tokens)
    and ("gap", b)."""
    import torch

    torch.set_num_threads(args.threads)
    kind, dtype = split_variant(name)
    call = lambda fn, *a: fn(*a)  # noqa: E731
    if kind == "hf":
        runner = HFGenerate(args.model, args, dtype)
    elif kind in VLLM_KINDS:
        runner = PeerVLLM(args.model, args, dtype, max_seq)
    else:
        runner = Ours(args.model, args, kind == "compiled", max(int(b) for b in args.batches.split(",")), max_seq,
                      dtype)
        call = runner.engine.call
    conn.send({"versions": versions(), "torch_threads": call(torch.get_num_threads),
               "threads": thread_setup(process_tree(os.getpid()))})
    while (msg := conn.recv()) is not None:
        if msg[0] == "run":
            _, b, n = msg
            conn.send({**timed(runner.run, ids[:b], n, call), **getattr(runner, "phase", {})})
        else:
            conn.send(call(logprob_gap, runner, args.model, ids[:msg[1]]))


def serve(address: str) -> int:
    """``--serve``: a variant's process, started by ``measure`` with the variant's interpreter."""
    from multiprocessing.connection import Client

    conn = Client(address, authkey=bytes.fromhex(os.environ.pop("BENCH_ENGINE_AUTHKEY")))
    serve_variant(*conn.recv(), conn)
    return 0


def start_variant(name: str, args, ids, max_seq: int, tmp: str):
    """The variant's process (its interpreter, its environment), connected; its log file for vLLM."""
    from multiprocessing.connection import Listener

    kind, _ = split_variant(name)
    key = os.urandom(16)
    env = {**os.environ, "BENCH_ENGINE_AUTHKEY": key.hex()}
    env.pop("VLLM_CPU_OMP_THREADS_BIND", None)  # vllm: vLLM's default (auto)
    if kind == "vllm-allcores":
        cores = sorted(os.sched_getaffinity(0))
        env["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, cores))
    python = args.vllm_python if kind in VLLM_KINDS else sys.executable
    log = Path(tempfile.gettempdir()) / f"bench_engine_{name.replace(':', '_')}.log"  # kept: a failure's cause
    with Listener(str(Path(tmp) / f"{name.replace(':', '_')}.sock"), authkey=key) as listener:
        out = open(log, "w") if kind in VLLM_KINDS else None  # vLLM's log stays out of the table
        proc = subprocess.Popen([python, __file__, "--serve", listener.address], env=env, stdout=out,
                                stderr=subprocess.STDOUT if out else None)
        box: list = []
        waiter = threading.Thread(target=lambda: box.append(listener.accept()), daemon=True)
        waiter.start()
        while waiter.is_alive():
            waiter.join(1)
            if proc.poll() is not None and waiter.is_alive():
                raise SystemExit(f"bench_engine: {name}'s process ({python}) ended with {proc.returncode}"
                                 + (f"; its log: {log}" if out else ""))
    conn = box[0]
    conn.send((name, args, ids, max_seq))
    try:
        ready = conn.recv()
    except EOFError:
        tail = log.read_text()[-3000:] if out else ""
        raise SystemExit(f"bench_engine: {name} failed to start\n{tail}") from None
    return proc, conn, ready, log if out else None


def vllm_log(path: Path) -> list[str]:
    """vLLM's own lines about its OpenMP binding and torch threads (timestamps cut)."""
    keep = []
    for line in path.read_text(errors="replace").splitlines():
        if "ompmultiprocessing.py" in line or "Reducing Torch threads" in line:
            keep.append(line.split("] ", 1)[-1].strip())
    return keep


def measure(args, tmp: str) -> dict:
    from escrag.models import load_tokenizer

    batches = [int(b) for b in args.batches.split(",")]
    names = [v for v in args.variants.split(",") if v]
    for name in names:  # a bad name is named here, before any variant's process starts
        split_variant(name)
    ids = prompts(load_tokenizer(args.model), max(batches))
    max_seq = max(len(p) for p in ids) + args.new_tokens + 1
    procs, conns, setup, logs = [], {}, {}, {}
    try:
        for name in names:  # one process per variant; they take turns, never run at once
            proc, conns[name], setup[name], logs[name] = start_variant(name, args, ids, max_seq, tmp)
            procs.append(proc)
            print(f"started {label(name)}: {setup[name]['versions']['executable']}", flush=True)

        def ask(name, *msg):
            conns[name].send(msg)
            try:
                return conns[name].recv()
            except EOFError:
                tail = logs[name].read_text()[-4000:] if logs[name] else ""
                raise SystemExit(f"bench_engine: {name}'s process ended at {msg} (log: {logs[name]})\n{tail}") from None

        warm = {}
        for name in names:  # warm-up: first calls (and compiles) are not in the table
            n = args.new_tokens if split_variant(name)[0] == "compiled" else WARMUP_TOKENS
            for b in batches:
                warm[f"{name}/b{b}"] = ask(name, "run", b, n)["seconds"]
                print(f"warm-up {label(name)} b{b} ({n} tokens): {warm[f'{name}/b{b}']:.1f} s", flush=True)
        runs = {f"{n}/b{b}": [] for n in names for b in batches}
        for r in range(args.repeats):
            for b in batches:
                for name in names:
                    first = ask(name, "run", b, 1)  # its prefill: the same batch making 1 token
                    x = ask(name, "run", b, args.new_tokens)
                    x["prefill_run_s"] = first["seconds"]
                    x["step_ms"] = 1e3 * (x["seconds"] - first["seconds"]) / (args.new_tokens - 1)
                    runs[f"{name}/b{b}"].append(x)
                    print(f"round {r} {label(name):<26} b{b:<3} {x['tok_s']:7.1f} tok/s, {x['tok_cpu_s']:7.1f} "
                          f"tok/cpu-s, step {x['step_ms']:6.1f} ms (load {x['load1']:.1f})", flush=True)
        res = {"config": {k: v for k, v in vars(args).items() if k != "serve"}, "prompt_tokens": [len(p) for p in ids],
               "warmup_s": warm, "runs": runs,
               "median_tok_s": {k: statistics.median(x["tok_s"] for x in v) for k, v in runs.items()},
               "median_tok_cpu_s": {k: statistics.median(x["tok_cpu_s"] for x in v) for k, v in runs.items()}}
        compiled = [n for n in names if split_variant(n)[0] == "compiled"]
        if compiled:
            res["compile_s"] = {f"{n}/b{b}": warm[f"{n}/b{b}"] - statistics.median(
                x["seconds"] for x in runs[f"{n}/b{b}"]) for n in compiled for b in batches}
        mine = [n for n in names if ours(n)]
        if mine:
            res["logprob_gap"] = ask(mine[-1], "gap", batches[-1])
        res["load1"] = [x["load1"] for v in runs.values() for x in v]
        res["setup"] = setup
        res["vllm_log"] = {n: vllm_log(p) for n, p in logs.items() if p}
        return res
    finally:
        for conn in conns.values():
            try:
                conn.send(None)
            except OSError:
                pass
        for proc in procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.terminate()


def measure_by_dtype(args, tmp: str) -> dict:
    """``measure`` for the variants of each dtype in turn, merged: their processes are alive together only
    within a dtype (four vLLM variants' processes at once, ~4 GiB each, outgrew this 23 GiB machine
    beside other work: the OOM killer took a vLLM worker). Ratios compare variants of one dtype."""
    import copy

    names = [v for v in args.variants.split(",") if v]
    groups: dict[str, list[str]] = {}
    for n in names:
        groups.setdefault(split_variant(n)[1], []).append(n)
    res: dict = {}
    for group in groups.values():
        sub = copy.copy(args)
        sub.variants = ",".join(group)
        part = measure(sub, tmp)
        for key, value in part.items():
            if isinstance(value, dict) and key not in ("config", "logprob_gap"):
                res.setdefault(key, {}).update(value)
            elif key == "load1":
                res.setdefault(key, []).extend(value)
            else:
                res[key] = value  # prompt_tokens alike; logprob_gap: the last dtype's ours
    res["config"] = {k: v for k, v in vars(args).items() if k != "serve"}
    return res


def why(res: dict) -> dict:
    """Per variant and batch, the medians that say where the time goes (module doc)."""
    out = {}
    for key, v in res["runs"].items():
        names = sorted({p for x in v for p in x["procs"]})
        out[key] = {"step_ms": statistics.median(x["step_ms"] for x in v),
                    "prefill_run_s": statistics.median(x["prefill_run_s"] for x in v),
                    "cores": statistics.median(x["cpu_s"] / x["seconds"] for x in v),
                    "procs": {p: {**{m: statistics.median(x["procs"].get(p, {}).get(m, 0) for x in v)
                                     for m in ("cores", "busy_threads")},
                                  "busy_cpus": sorted({c for x in v for c in x["procs"].get(p, {}).get("busy_cpus", [])})}
                              for p in names}}
    return out


def ratios(res: dict) -> dict:
    """Ours over each peer that ran at the same dtype (median tok/s over median tok/s)."""
    names = [n for n in res["config"]["variants"].split(",") if n]
    med, out = res["median_tok_s"], {}
    for n in names:
        for kind in ("hf", *VLLM_KINDS):
            base = baseline_of(n, names, kind)
            for b in res["config"]["batches"].split(","):
                if base:
                    out.setdefault(f"{n}/b{b}", {})[base] = med[f"{n}/b{b}"] / med[f"{base}/b{b}"]
    return out


def machine() -> dict:
    """lscpu's model name, the core count and the bfloat16 instructions of this CPU."""
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    except OSError:
        lscpu = ""
    model = next((ln.split(":", 1)[1].strip() for ln in lscpu.splitlines() if ln.startswith("Model name")), "unknown")
    flags = set(next((ln.split(":", 1)[1].split() for ln in _read("/proc/cpuinfo").splitlines()
                      if ln.startswith("flags")), []))
    cpu = {"model_name": model, "cpus": len(os.sched_getaffinity(0)),
           **{f: f in flags for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16")}}
    bf16 = "AVX512-BF16" if cpu["avx512_bf16"] else "no AVX512-BF16"
    return {"cpu": cpu, "machine": f"{model}, {cpu['cpus']} cores, {bf16}" + (", AMX" if cpu["amx_bf16"] else "")}


def weight_read_bound(spec: str, names: list[str], runs: dict) -> dict:
    """The copy bandwidth read beside the runs (median, range), the model's weight bytes per dtype of
    the variants, and per variant and batch the median share of the bound of each run (vLLM's decode
    steps: from ``step_ms``; ours: from the engine's stats)."""
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
            decode = [x["decode_rows"] / x["decode_s"] if "decode_s" in x else 1e3 * b / x["step_ms"]
                      for x in runs[key]]  # the decode steps alone: what the bound bounds
            out["decode_share"][key] = statistics.median(d / y for d, y in zip(decode, bound))
    return out


def print_table(res: dict) -> None:
    batches = res["config"]["batches"].split(",")
    names = [n for n in res["config"]["variants"].split(",") if n]
    peers = [k for k in VLLM_KINDS if any(split_variant(n)[0] == k for n in names)]
    for key, unit in (("median_tok_s", "tok/s"), ("median_tok_cpu_s", "tok/cpu-s")):
        med = res[key]
        cols = ["x hf", *(f"x {KINDS[k].replace('vLLM CPU', 'vLLM').replace('all cores', 'all')}" for k in peers)]
        print(f"\n{'variant':<26}" + "".join(f"{'b' + b + ' ' + unit:>16}" + "".join(f"{c:>9}" for c in cols)
                                        for b in batches)
              + (f"{'b' + batches[0] + ' of bound':>14}{'decode':>8}" if key == "median_tok_s" else ""))
        for n in names:
            row = f"{label(n):<26}"
            bases = [baseline_of(n, names, k) for k in ("hf", *peers)]
            for b in batches:
                v = med[f"{n}/b{b}"]
                row += f"{v:>16.1f}" + "".join(f"{v / med[f'{base}/b{b}']:>9.2f}" if base else f"{'':>9}"
                                               for base in bases)
            bd = res.get("bound", {}) if key == "median_tok_s" else {}
            share, dec = (bd.get(k, {}).get(f"{n}/b{batches[0]}") for k in ("share", "decode_share"))
            print(row + (f"{share:>13.0%}{dec:>8.0%}" if share is not None else ""))
    if "why" in res:
        print(f"\n{'where the time goes':<26}{'batch':>6}{'tokens':>8}{'step ms':>9}{'prefill s':>10}{'cores':>7}"
              "  per process: cores busy (busy threads on CPUs)")
        for key, w in res["why"].items():
            n, b = key.rsplit("/b", 1)
            procs = ", ".join(f"{p} {x['cores']:.2f} ({x['busy_threads']:g} on {x['busy_cpus']})"
                              for p, x in w["procs"].items() if x["busy_threads"] or x["cores"] >= 0.01)
            print(f"{label(n):<26}{b:>6}{'/'.join(map(str, res['tokens'][key])):>8}{w['step_ms']:>9.1f}"
                  f"{w['prefill_run_s']:>10.2f}{w['cores']:>7.2f}  {procs}")
        for n, s in res["setup"].items():
            print(f"{label(n)}: torch threads {s['torch_threads']}; " + "; ".join(
                f"{p}: " + ", ".join(f"{k} {v}" for k, v in d.items()) for p, d in s["threads"].items()))
        for n, lines in res.get("vllm_log", {}).items():
            print(f"{label(n)}, vLLM's log: " + " | ".join(lines))
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
    print(f"1-min load average during the runs: {min(loads):.1f}-{max(loads):.1f} on {os.cpu_count()} CPUs; "
          f"{res.get('machine', '')}")


def main(argv=None) -> int:
    from escrag.atomic import write_json

    args = parse_args(argv)
    if args.serve:
        return serve(args.serve)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-engine-") as tmp:
        if args.cold_compile:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = tmp  # read when inductor first compiles
        res = (measure_by_dtype if args.by_dtype else measure)(args, tmp)
    res["tokens"] = {k: sorted({x["tokens"] for x in v}) for k, v in res["runs"].items()}
    res["ratios"], res["why"] = ratios(res), why(res)
    res.update(machine())
    res["versions"] = {n: s["versions"] for n, s in res["setup"].items()}
    res["bound"] = weight_read_bound(args.model, [n for n in args.variants.split(",") if n], res["runs"])
    res["wall_s"] = time.perf_counter() - t0
    print_table(res)
    print(f"the whole run: {res['wall_s']:.0f} s")
    print(f"wrote {write_json(args.out, res)}")
    return 0


if __name__ == "__main__":
    from escrag.runtime import tune_process

    tune_process()
    sys.exit(main())
