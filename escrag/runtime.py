"""Process tuning for the jobs, servers and Ray actors: one explicit call, ``tune_process()``, made by
``escrag.errors.run_main`` (every job, server and CLI command) and ``escrag.models.actor_env`` (every
Ray actor). Importing ``escrag`` changes nothing in the process.

Owns two settings, each left alone where the user set their own:
- ``GOMP_SPINCOUNT=20000``: how long an idle OpenMP worker of torch spins before it sleeps. libgomp
  reads it when torch loads, so a process gets it from its parent (a job sets it before it starts Ray
  or its servers, which inherit it); libgomp's default (300,000) is fastest on a quiet CPU and
  collapses when another process wants the cores (a SmolLM2 decode step beside one busy process on 2
  cores: 615 ms at the default, 43 ms at this value quiet).
- glibc's ``mallopt``: no allocation ``mmap``-ed on its own and up to 1 GiB of free heap top kept, so a
  large tensor freed and made again reuses pages already faulted in (tests/test_allocator.py). Any
  ``MALLOC_*`` variable or ``GLIBC_TUNABLES``, or ``ESCRAG_KEEP_FREED_MEMORY=0``, leaves glibc's defaults.
"""

from __future__ import annotations

import os


def tune_process() -> bool:
    """Apply both settings to this process; True where glibc's allocator took the second."""
    os.environ.setdefault("GOMP_SPINCOUNT", "20000")
    return _keep_freed_memory()


def _keep_freed_memory() -> bool:
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
