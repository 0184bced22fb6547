"""The GPU check for the machine this project can be lent (one H100, about 79 GiB, or one H200, about
139 GiB; torch, transformers and peft, no vLLM, Ray, DeepSpeed, FAISS or servers): the project's own
learner and engine code, timed and measured, one JSON file of results. ``tests/gpu/device_check.sh``
runs it there; ``--cpu`` runs every part at tiny shapes on the CPU (tests/test_device_check.py, so the
script does not rot). The sweeps are sized from the card's memory (``gpu_sizes``), not for one kind.

Exit status: 0 when every part that was asked for ran and passed its checks, 1 when any failed (an
exception, an out-of-memory of the whole part, a check such as the agreement's, or a part the budget
skipped); ``"failed"`` in the JSON names them. An out-of-memory is a result: caught, written to the JSON
(``{"oom": true}`` for one run of a sweep, which is a measurement, not a failure), never a crash.
``DEVICE_CHECK_FAIL=part,...`` / ``DEVICE_CHECK_OOM=part,...`` make those parts raise an exception / a
``torch.OutOfMemoryError`` as they start (tests/test_device_check.py checks the exit status with them).

Parts (each recorded, a failure or an out-of-memory recorded as such, never fatal to the others):
1. ``agreement``: the tiny model on the CPU and on the GPU, float32: the learner's log-probs (max abs
   difference, must be <= 1e-4), a learner step's loss and KL (the second step, away from the
   reference), the engine's greedy tokens (equal).
   With ``--cpu`` both sides are the CPU (a determinism check).
2. ``learner``: a Qwen2.5-3B-shaped policy from its config (random weights, saved once in bfloat16),
   full fine-tune ``Learner.step`` in bfloat16 autocast over float32 master weights with its reference,
   at the paper preset's ``grpo.micro_batch_size``, sequence length swept, gradient checkpointing on
   and off: peak memory, step time, tokens/s, next to the placement plan's estimate for the same.
3. ``engine``: the transformers engine (``HFEngine``) at that shape in bfloat16: prefill and decode
   tokens/s.
4. ``reward``: a Qwen2.5-7B-shaped reward backbone (``AutoModel``, last-token hidden state as
   ``reward_server.model.Backbone.features`` reads it) in bfloat16 and float32: items/s at 4,096
   tokens, peak memory.
Needs torch, transformers, peft, safetensors, pyyaml, tqdm, numpy and pydantic (the config; the shell
script installs carried wheels when the machine has none); imports no Ray, server, FAISS or vLLM code
(the JSON lists the third-party modules it loaded). Stops starting new parts after ``--budget-s``.

Observable where it runs unattended: a line as each part (and each side of the agreement) starts and
ends, the JSON rewritten before each part (a killed run leaves ``{"running": true}`` on the part it was
in), and every thread's Python stack printed each ``--part-timeout-s`` a part runs past,
so a hang shows where it is. ``--only agreement`` runs one part (a cheap first look).

    python tests/gpu/device_check.py --out DIR [--cpu] [--tiny MODEL_DIR] [--budget-s 420]
        [--part-timeout-s 120] [--only PART,...]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
print(f"[device-check] importing torch and the project from {ROOT}", flush=True)

import torch  # noqa: E402

from escrag.config import load_config  # noqa: E402
from escrag.records import Sample, ScoredGroup, TokenSequence  # noqa: E402
from escrag.shapes import KNOWN, Shape, hf_config  # noqa: E402

PRESET = ROOT / "configs" / "paper-3b.yaml"
PARTS = ("agreement", "learner", "engine", "reward")
TINY = Shape("qwen2", 64, 2, 4, 2, 128, 49152, True, 4096)
# --cpu: sequence lengths of the learner sweep, engine prompts x tokens, RM items x tokens; a GPU's: gpu_sizes()
CPU_SIZES = {"seqs": (64, 128), "prefill": (4, 64), "decode": (4, 16, 8), "rm": (2, 64)}
GPU_SEQS, RM_TOKENS = (1024, 2048, 4096, 8192), 4096


def gpu_sizes(total_gb: float, policy: Shape, rm: Shape, scored: int) -> dict:
    """The sweeps for a GPU of ``total_gb`` (torch's ``get_device_properties``): the learner's lengths
    whose checkpointed estimate (``trainer.placement.learner_gb``, at the preset's micro-batch) fits 0.9 of the card (so an H100 and an
    H200 each run what they can hold; the runs without checkpointing that do not fit are recorded as
    OOM), the reward batch the card holds in float32 at 4,096 tokens (1 to 8 items)."""
    from trainer.placement import GIB, forward_gb, learner_gb

    room = 0.9 * total_gb
    cfg = load_config(PRESET, ["policy.gradient_checkpointing=true"])
    seqs = tuple(s for s in GPU_SEQS if learner_gb(cfg, policy, s, min(scored, s // 2))[0] <= room) or GPU_SEQS[:1]
    per_item, weights = forward_gb(rm, RM_TOKENS, 4), rm.params * 4 / GIB
    items = max(1, min(8, int((room - weights) // max(per_item, 1e-9))))
    return {"seqs": seqs, "prefill": (32, 1024), "decode": (64, 128, 128), "rm": (items, RM_TOKENS),
            "total_gb": total_gb}


def _injected(part: str) -> None:
    """DEVICE_CHECK_FAIL / DEVICE_CHECK_OOM: make ``part`` fail as it starts (the exit status's test)."""
    import os

    if part in os.environ.get("DEVICE_CHECK_OOM", "").split(","):
        raise torch.OutOfMemoryError(f"DEVICE_CHECK_OOM={part}: injected out-of-memory")
    if part in os.environ.get("DEVICE_CHECK_FAIL", "").split(","):
        raise RuntimeError(f"DEVICE_CHECK_FAIL={part}: injected failure")


def failures(result: dict, parts: tuple[str, ...]) -> list[str]:
    """The asked-for parts that failed: missing, skipped, an error or OOM of the whole part, or a check."""
    bad = []
    for name in parts:
        r = result.get(name)
        if not isinstance(r, dict) or any(k in r for k in ("error", "oom", "skipped", "running")):
            bad.append(name)
        elif name == "agreement" and not (r.get("logprobs_within_1e-4") and r.get("greedy_tokens_equal")):
            bad.append(name)
        elif name == "learner" and not any("peak_gb" in run or "tokens_per_s" in run for run in r.get("runs", [])):
            bad.append(name)
    return bad


def _cfg(model: str, device: str, *over: str):
    """The paper-3b preset, local backend, on ``device`` with ``model``."""
    return load_config(PRESET, ["grpo.backend=local", f"policy.model={model}", f"policy.device={device}",
                                f"rollout.device={device}", "rollout.compile=false", "safety.rollout_metric=false",
                                *over])


def _groups(vocab: int, rows: int, seq: int, scored: int, seed: int = 0) -> list[ScoredGroup]:
    """Groups of 4 random sequences of ``seq`` tokens, the last ``scored`` (less 2 per sample, so the
    token mean weighs the samples unequally) trained, rewards alternating 0 / 1."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(0, rows, 4):
        samples = []
        for j in range(min(4, rows - i)):
            ids = torch.randint(3, vocab, (seq,), generator=g).tolist()
            trained = max(1, scored - 2 * j)
            mask = [0] * (seq - trained) + [1] * trained
            old = [(-2.0 if m else 0.0) for m in mask]
            samples.append(Sample(TokenSequence(ids, mask, old), output="", reward=float(j % 2)))
        out.append(ScoredGroup(f"check/{i}", samples, 0))
    return out


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def agreement(tiny: str, other: str) -> dict:
    """The tiny model, float32, on the CPU and on ``other``: log-probs, a learner step, greedy tokens."""
    from rollout.engines.base import SamplingParams
    from rollout.engines.hf_engine import HFEngine
    from trainer.learner import Learner

    out, learners = {}, {}
    groups = _groups(TINY.vocab, 8, 48, 16)
    seqs = [s.sequence for grp in groups for s in grp.samples]
    for device in ("cpu", other):
        cfg = _cfg(tiny, device, "policy.dtype=float32", "grpo.micro_batch_size=8", "grpo.lr=1e-3")
        _say(f"agreement: {device}: learner")
        learner = Learner(cfg)
        tails = torch.tensor([s.loss_mask[-16:] for s in seqs], dtype=torch.float32)  # the trained tokens
        logp = learner.sequence_logprobs(seqs, tails).detach().cpu()
        learner.step(groups)
        m = learner.step(groups)  # the second step: the policy has left its reference (KL > 0)
        _say(f"agreement: {device}: engine")
        engine = HFEngine(tiny, cfg.rollout, dtype="float32", seed=0)
        gens = engine.generate([[1, 504, 2088, 314], [1, 9519, 28, 940, 446], [1, 77, 78]],
                               SamplingParams(16, 0.0, 1.0, 0, ()))
        engine.close()
        learners[device] = (logp, m, [g.token_ids for g in gens])
    (lp0, m0, t0), (lp1, m1, t1) = learners["cpu"], learners[other]
    out["logprob_max_abs_diff"] = float((lp0 - lp1).abs().max())
    out["logprobs_within_1e-4"] = out["logprob_max_abs_diff"] <= 1e-4
    out.update({f"step_{k}": [m0[k], m1[k]] for k in ("loss", "kl", "grad_norm")})
    out["step_loss_abs_diff"], out["step_kl_abs_diff"] = abs(m0["loss"] - m1["loss"]), abs(m0["kl"] - m1["kl"])
    out["greedy_tokens_equal"] = t0 == t1
    out["devices"] = ["cpu", other]
    return out


def build_model(shape: Shape, folder: Path, tiny: str, device: str) -> Path:
    """A random-weight causal LM of ``shape`` saved in bfloat16 with the tiny model's tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny)
    config = hf_config(shape, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                       pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    del model
    return folder


def learner_sweep(folder: Path, shape: Shape, device: str, seqs: tuple) -> dict:
    """``Learner.step`` at the preset's micro-batch, each length with checkpointing off and on, beside
    the placement plan's estimate (``trainer.placement.learner_gb``) for the same."""
    from trainer.learner import Learner
    from trainer.placement import learner_gb
    from trainer.policy import eval_mode, set_checkpointing

    cfg = _cfg(str(folder), device, "policy.dtype=bfloat16")
    micro, learner, runs = cfg.grpo.micro_batch_size, Learner(cfg), []
    for seq in seqs:
        scored = min(cfg.rollout.max_new_tokens_stage2, seq // 2)
        for ckpt in (False, True):
            set_checkpointing(learner.model, ckpt)
            eval_mode(learner.model)
            with_ckpt = load_config(PRESET, [f"policy.gradient_checkpointing={str(ckpt).lower()}"])
            run = {"seq": seq, "micro_batch": micro, "checkpointing": ckpt,
                   "estimate_gb": learner_gb(with_ckpt, shape, seq, scored)[0]}
            run.update(_timed_step(learner, _groups(shape.vocab, micro, seq, scored), device))
            runs.append(run)
    return {"shape": "tiny" if shape == TINY else "Qwen/Qwen2.5-3B-Instruct", "params": shape.params, "runs": runs}


def _timed_step(learner, groups, device: str) -> dict:
    """Peak memory, time and tokens/s of one ``Learner.step`` (after one untimed warm-up step)."""
    tokens = sum(len(s.sequence.input_ids) for g in groups for s in g.samples)
    try:
        learner.step(groups)
        if device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        _sync(device)
        t = time.perf_counter()
        m = learner.step(groups)
        _sync(device)
        dt = time.perf_counter() - t
    except torch.OutOfMemoryError:
        _free()
        return {"oom": True}
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else None
    return {"peak_gb": peak, "step_s": dt, "tokens_per_s": tokens / dt, "loss": m["loss"]}


def _free() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def engine_rates(folder: Path, device: str, sizes: dict) -> dict:
    """The transformers engine at the folder's shape in bfloat16, greedy, no stop string, no prefix
    cache: prefill tokens/s (one new token per row) and decode tokens/s (the extra time and rows of a
    run with ``new`` tokens over the same prompts with one), from the engine's own counters."""
    from rollout.engines.base import SamplingParams
    from rollout.engines.hf_engine import HFEngine

    cfg = _cfg(str(folder), device, "rollout.max_batch=64", "rollout.max_seq_len=4096", "rollout.prefix_cache_tokens=0")
    engine = HFEngine(str(folder), cfg.rollout, dtype="bfloat16", seed=0)

    def timed(prompts, new):
        before, t = dict(engine.stats), time.perf_counter()
        engine.generate(prompts, SamplingParams(new, 0.0, 1.0, 0, ()))
        return time.perf_counter() - t, {k: v - before[k] for k, v in engine.stats.items()}

    def prompts(rows, length, salt):
        return [[3 + (salt * i + j) % 40000 for j in range(length)] for i in range(rows)]

    try:
        timed(prompts(2, 16, 5), 2)  # warm-up
        t1, s1 = timed(prompts(*sizes["prefill"], 7), 1)
        rows, length, new = sizes["decode"]
        ta, sa = timed(prompts(rows, length, 11), 1)
        tb, sb = timed(prompts(rows, length, 11), new)
    finally:
        engine.close()
    decoded = sb["decode_rows"] - sa["decode_rows"]
    return {"prefill_tokens_per_s": s1["prefill_tokens"] / t1, "prefill_tokens": s1["prefill_tokens"],
            "decode_tokens_per_s": decoded / max(tb - ta, 1e-9), "decode_tokens": decoded, "decode_batch": rows}


def reward_rates(shape: Shape, device: str, sizes: dict) -> dict:
    """A reward backbone of ``shape`` in bfloat16 and float32: items/s at the given length."""
    from transformers import AutoModel

    items, length = sizes["rm"]
    out = {}
    for dtype in (torch.bfloat16, torch.float32):
        name = str(dtype).split(".")[-1]
        try:
            with torch.device(device):
                model = AutoModel.from_config(hf_config(shape), dtype=dtype).eval()
            ids = torch.randint(3, shape.vocab, (items, length), device=device)
            mask = torch.ones_like(ids)
            if device.startswith("cuda"):
                torch.cuda.reset_peak_memory_stats()
            with torch.inference_mode():
                model(input_ids=ids[:1], attention_mask=mask[:1])
                _sync(device)
                t, reps = time.perf_counter(), 3
                for _ in range(reps):
                    model(input_ids=ids, attention_mask=mask).last_hidden_state[:, -1].float().cpu()
                _sync(device)
            dt = (time.perf_counter() - t) / reps
            out[name] = {"items_per_s": items / dt, "batch": items, "tokens": length,
                         "peak_gb": torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else None}
        except torch.OutOfMemoryError:
            out[name] = {"oom": True}
        model = None
        _free()
    return out


def _modules() -> list[str]:
    """Top-level third-party modules loaded (the check must stay within torch, transformers and peft)."""
    std = set(sys.stdlib_module_names)
    own = {"escrag", "trainer", "rollout", "reward_server", "retriever_server", "evaluation", "ray_jobs", "tests"}
    return sorted({m.split(".")[0] for m in sys.modules if not m.startswith("_")} - std - own)


def _say(line: str) -> None:
    print(f"[device-check] {line}", flush=True)


@contextlib.contextmanager
def _watchdog(part: str, every_s: float):
    """Every ``every_s`` the part runs, every other thread's Python stack printed (a hang shows where it
    is). A thread reading ``sys._current_frames``: ``faulthandler``'s timer crashed this process on a CPU
    run while torch's threads were busy."""
    done = threading.Event()

    def watch():
        waited = 0.0
        while not done.wait(every_s):
            waited += every_s
            stacks = [f"--- thread {tid}\n" + "".join(traceback.format_stack(frame))
                      for tid, frame in sys._current_frames().items() if tid != threading.get_ident()]
            _say(f"{part}: still running after {waited:.0f} s; stacks:\n" + "".join(stacks))

    thread = threading.Thread(target=watch, daemon=True, name=f"watchdog-{part}")
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def run(out: Path, cpu: bool, tiny: str, budget_s: float, part_timeout_s: float = 120.0,
        only: tuple[str, ...] = ()) -> dict:
    device = "cpu" if cpu or not torch.cuda.is_available() else "cuda"
    t0 = time.perf_counter()
    big, rm = (TINY, TINY) if device == "cpu" else (KNOWN["Qwen/Qwen2.5-3B-Instruct"], KNOWN["Qwen/Qwen2.5-7B"])
    result = {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu", "torch": torch.__version__,
              "mode": "cpu" if device == "cpu" else "gpu"}
    if device == "cuda":
        free, total = torch.cuda.mem_get_info()
        result["gpu_total_gb"], result["context_gb"] = total / 2**30, (total - free) / 2**30
        preset = load_config(PRESET)
        cfg_sizes = gpu_sizes(torch.cuda.get_device_properties(0).total_memory / 2**30, big, rm,
                              preset.rollout.max_new_tokens_stage2)
    else:
        cfg_sizes = CPU_SIZES
    result["sizes"] = cfg_sizes
    with tempfile.TemporaryDirectory(prefix="device-check-") as tmp:
        parts = [("agreement", lambda: agreement(tiny, device)),
                 ("learner", lambda: learner_sweep(build_model(big, Path(tmp) / "policy", tiny, device), big,
                                                   device, cfg_sizes["seqs"])),
                 ("engine", lambda: engine_rates(Path(tmp) / "policy", device, cfg_sizes)),
                 ("reward", lambda: reward_rates(rm, device, cfg_sizes))]
        for name, part in parts:
            if only and name not in only:
                continue
            if time.perf_counter() - t0 > budget_s:
                result[name] = {"skipped": f"--budget-s {budget_s:g} spent"}
                continue
            result[name] = {"running": True}  # what a killed run leaves in the JSON
            (out / "device_check.json").write_text(json.dumps(result, indent=2) + "\n")
            _say(f"{name}: start at {time.perf_counter() - t0:.1f} s")
            t = time.perf_counter()
            try:
                with _watchdog(name, part_timeout_s):
                    _injected(name)
                    result[name] = part()
            except torch.OutOfMemoryError as exc:  # a result, not a crash: the other parts still run
                result[name] = {"oom": True, "error": f"OutOfMemoryError: {exc}"[:2000]}
            except Exception as exc:  # recorded: the other parts still run
                result[name] = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
            result[name]["seconds"] = time.perf_counter() - t
            state = "oom" if "oom" in result[name] else "error" if "error" in result[name] else "done"
            _say(f"{name}: {state} in {result[name]['seconds']:.1f} s")
            _free()
            (out / "device_check.json").write_text(json.dumps(result, indent=2) + "\n")
    result["third_party_modules"], result["seconds"] = _modules(), time.perf_counter() - t0
    result["failed"] = failures(result, tuple(p for p in PARTS if not only or p in only))
    (out / "device_check.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="folder for device_check.json")
    p.add_argument("--cpu", action="store_true", help="every part at tiny shapes on the CPU")
    p.add_argument("--tiny", default="tiny-random:qwen2", help="the tiny model (a spec or its folder)")
    p.add_argument("--budget-s", type=float, default=420.0, help="start no new part after this many seconds")
    p.add_argument("--part-timeout-s", type=float, default=120.0,
                   help="a part running longer prints every thread's stack to stdout, again each time this passes")
    p.add_argument("--only", default="", help="comma-separated parts to run (default: all)")
    args = p.parse_args(argv)
    _say(f"torch {torch.__version__}, CUDA {'yes' if torch.cuda.is_available() else 'no'}")
    from escrag.models import resolve_model

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    only = tuple(p for p in args.only.split(",") if p)
    if set(only) - set(PARTS):
        p.error(f"--only: unknown part(s) {sorted(set(only) - set(PARTS))}; the parts are {', '.join(PARTS)}"
                " (engine reuses the model the learner part builds)")
    result = run(out, args.cpu, resolve_model(args.tiny), args.budget_s, args.part_timeout_s, only)
    print(json.dumps({k: v for k, v in result.items() if k != "third_party_modules"}, indent=1)[:6000])
    if result["failed"]:
        _say(f"FAILED: {', '.join(result['failed'])} (device_check.json has each part's error or check)")
        return 1
    _say("every part passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
