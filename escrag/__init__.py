"""escrag: the domain core of ESCRAG-R1 (data, prompts, output format, config, models, CLI).

Kept free of heavy imports: importing ``escrag`` loads neither torch nor faiss.

It sets one process default before torch loads (so libgomp, PyTorch's OpenMP runtime, reads it at
load, and Ray workers and servers started from here inherit it): ``GOMP_SPINCOUNT=20000``, how long
an idle OpenMP worker spins before it sleeps. libgomp's default (300,000) makes the fastest hand-off
between ops on a quiet CPU but collapses when any other process wants the cores: a SmolLM2 decode
step at batch 8 on this 2-core machine took 41 ms quiet and 615 ms beside one busy process; at 20,000
it takes 43 ms quiet, and at 30,000 / 10,000 179 / 107 ms beside that process (rollout/engines/hf_engine.py).
Set ``GOMP_SPINCOUNT`` yourself to override."""

import os

os.environ.setdefault("GOMP_SPINCOUNT", "20000")

__version__ = "0.1.0"
