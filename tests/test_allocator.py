"""Importing ``escrag`` keeps freed memory in the process (escrag/__init__.py): a pass of large tensors
(1-32 MiB, ~91 MiB together), freed and made again, mostly reuses pages already faulted in. Without it
(``ESCRAG_KEEP_FREED_MEMORY=0``, glibc's defaults) each is a fresh mapping. Five passes after a first,
on this machine: 6-13k page faults with it, 42-70k without (23,296 pages a pass). A ``MALLOC_*``
variable of the user's leaves glibc alone.
Run: .venv/bin/python -m pytest -q tests/test_allocator.py  (~10 s)"""

import json
import os
import subprocess
import sys

import pytest

SIZES = (2**18, 2**20, 3 * 2**19, 2**22, 2**21, 2**23, 2**20, 5 * 2**20)  # float32 elements: 1-32 MiB
PROBE = f"""
import json, resource
import escrag, torch
torch.set_num_threads(1)

def one_pass():  # a forward/backward's worth of activations: large tensors alive together, then freed
    kept = [torch.ones(n) for n in {SIZES}]
    del kept

one_pass()  # the first pass is faulted in either way
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    one_pass()
print(json.dumps({{"applied": escrag.KEEPS_FREED_MEMORY,
                  "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before}}))
"""


def _probe(**env) -> dict:
    base = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    res = subprocess.run([sys.executable, "-c", PROBE], env={**base, **env}, capture_output=True, text=True,
                         timeout=120, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_tensors_are_not_faulted_in_again():
    kept, default = _probe(), _probe(ESCRAG_KEEP_FREED_MEMORY="0")
    assert kept["applied"] and not default["applied"]
    per_pass = sum(SIZES) * 4 // 4096
    assert default["faults"] > 1.5 * per_pass, default  # glibc maps most of them afresh
    assert kept["faults"] < default["faults"] / 2, (kept, default)


def test_the_users_malloc_settings_win():
    assert not _probe(MALLOC_ARENA_MAX="2")["applied"]
