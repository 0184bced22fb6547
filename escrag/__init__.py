"""escrag: the domain core of ESCRAG-R1 (data, prompts, output format, config, models, CLI).

Kept free of heavy imports: importing ``escrag`` loads neither torch nor faiss.

It sets one process default before torch loads (so libgomp, PyTorch's OpenMP runtime, reads it at
load, and Ray workers and servers started from here inherit it): ``GOMP_SPINCOUNT=20000``, how long
an idle OpenMP worker spins before it sleeps. libgomp's default (300,000) makes the fastest hand-off
between ops on a quiet CPU but collapses when any other process wants the cores: a SmolLM2 decode
step at batch 8 on this 2-core machine took 41 ms quiet and 615 ms beside one busy process; at 20,000
it takes 43 ms quiet, and at 30,000 / 10,000 179 / 107 ms beside that process (rollout/engines/hf_engine.py).
Set ``GOMP_SPINCOUNT`` yourself to override.

It also keeps freed memory in the process (glibc only; ``_keep_freed_memory``): no allocation is
``mmap``-ed on its own (``M_MMAP_MAX`` 0) and up to 1 GiB of free heap top is not given back
(``M_TRIM_THRESHOLD``). glibc's defaults map every large tensor freshly and unmap it when freed, so the
next one page-faults its memory in again (glibc raises its mmap threshold as mapped chunks are freed,
but never above 32 MiB: a batch's logits or a long sequence's activations stay mapped afresh). On this machine (a VM, where a fault is dear, and dearer at
some hours than others) a LoRA learner step on the demo batch (bench/bench_learner.py: SmolLM2, 8
sequences of ~410 tokens, bf16) took 7.2 s with it and 12.3 s without, one evening run each; a bf16
forward + backward of 4 x 400 tokens 3.0 s vs 4.0-4.4 s (system time 7-10 s vs 15-20 s over 10
passes), peak RSS +300-600 MB. Any ``MALLOC_*`` variable or ``GLIBC_TUNABLES`` in the environment, or
``ESCRAG_KEEP_FREED_MEMORY=0``, leaves glibc's defaults (tests/test_allocator.py)."""

import os

os.environ.setdefault("GOMP_SPINCOUNT", "20000")


def _keep_freed_memory() -> bool:
    """glibc's ``mallopt``: no per-allocation mmap, a 1 GiB trim threshold. False where not applied."""
    if os.environ.get("ESCRAG_KEEP_FREED_MEMORY", "1") == "0" or "GLIBC_TUNABLES" in os.environ or any(
            k.startswith("MALLOC_") for k in os.environ):
        return False
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt  # glibc and musl; absent on macOS and Windows
    except (AttributeError, OSError, TypeError):
        return False
    m_trim_threshold, m_mmap_max = -1, -4
    return bool(mallopt(m_mmap_max, 0)) and bool(mallopt(m_trim_threshold, 2**30))


KEEPS_FREED_MEMORY = _keep_freed_memory()

__version__ = "0.1.0"
