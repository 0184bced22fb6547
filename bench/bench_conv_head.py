"""The crisis check's conversation head: reads sharing their start on a cached K/V vs each read alone.

One run, side by side, the same reads through the same backbone (``safety.backbone``, its
``conv_layers``, ``conv_dtype`` resolved here; ``escrag.safety.backbone``): ``Backbone(share=False)``
batches renders of similar length (the path before) and ``Backbone(share=True)`` runs each family of
renders that begin alike once, the others' tails on its cache. Two workloads, the reads
``RiskClassifier`` makes (every prefix ending at a client turn, then the whole conversation):

- ``grpo``: the rollout metric of GRPO steps: ``--states`` ESConv train states (every 40th), each with
  4 answers (its gold counselor reply, repeated 1-4 times: answers of different lengths);
- ``tuning``: ``--cases`` cases of the bundled tuning set (seeded sample; the test suite's kind).

Columns: reads, tokens through the layers (padding included), seconds, the speedup, and the largest
difference in pooled states and in the shipped head's P(high). Writes ``bench/results/conv_head.json``.

    .venv/bin/python bench/bench_conv_head.py
    .venv/bin/python bench/bench_conv_head.py --states 2 --cases 10 --model tiny-random:llama --layers 1,2  # smoke
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from escrag.atomic import write_json  # noqa: E402
from escrag.config import load_config  # noqa: E402
from escrag.safety.backbone import Backbone, conv_dtype, render  # noqa: E402
from escrag.safety.classifier import conversation_reads  # noqa: E402


def reads_of(conversations: list[list[dict]]) -> list[list[dict]]:
    """The distinct reads ``RiskClassifier`` makes of these conversations."""
    reads = {}
    for h in conversations:
        for r in conversation_reads(h):
            reads.setdefault(render(r), r)
    return list(reads.values())


def workloads(a) -> dict[str, list[list[dict]]]:
    from escrag.data import load_states
    from escrag.safety.cases import load_cases

    grpo = [s.history + [{"role": "assistant", "content": " ".join([s.target] * k)}]
            for s in load_states("train")[: 40 * a.states: 40] for k in range(1, 5)]
    cases = random.Random(0).sample(load_cases("tuning"), a.cases)
    return {"grpo": reads_of(grpo), "tuning": reads_of([c["messages"] for c in cases])}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--states", type=int, default=8)
    p.add_argument("--cases", type=int, default=100)
    p.add_argument("--model", default=None, help="default: safety.backbone")
    p.add_argument("--layers", default=None, help="default: safety.conv_layers (comma-separated)")
    p.add_argument("--out", default=str(ROOT / "bench/results/conv_head.json"))
    a = p.parse_args(argv)
    sc = load_config(None).safety
    spec = a.model or sc.backbone
    layers = [int(x) for x in a.layers.split(",")] if a.layers else sc.conv_layers
    dtype = conv_dtype(sc)
    sides = {name: Backbone(spec, layers, sc.conv_batch, "cpu", dtype, share=name == "shared")
             for name in ("alone", "shared")}
    head = None
    if a.model is None and a.layers is None:
        from escrag.safety.heads import load_or_fit_conv_head

        head = load_or_fit_conv_head(sc, sides["alone"])
    rows = []
    for work, reads in workloads(a).items():
        got = {}
        for name, bb in sides.items():
            bb.tokens_read = 0
            t0 = time.perf_counter()
            feats = bb.features(reads)
            got[name] = (feats, time.perf_counter() - t0, bb.tokens_read)
        (fa, ta, na), (fb, tb, nb) = got["alone"], got["shared"]
        dp = float(np.abs(head.probs(fa)[:, 0] - head.probs(fb)[:, 0]).max()) if head else None
        rows.append({"workload": work, "reads": len(reads), "tokens_alone": na, "tokens_shared": nb,
                     "s_alone": ta, "s_shared": tb, "speedup": ta / tb,
                     "max_state_diff": float(np.abs(fa - fb).max()), "max_p_high_diff": dp})
    import torch

    result = {"model": spec, "layers": layers, "dtype": dtype, "threads": torch.get_num_threads(), "rows": rows}
    write_json(Path(a.out), result)
    print(f"conversation head reads, {spec} layers {layers}, {dtype}, {result['threads']} threads")
    print("| workload | reads | tokens alone | tokens shared | s alone | s shared | speedup | max Δ state | max Δ P(high) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        dp = "-" if r["max_p_high_diff"] is None else f"{r['max_p_high_diff']:.1e}"
        print(f"| {r['workload']} | {r['reads']} | {r['tokens_alone']:,} | {r['tokens_shared']:,} | {r['s_alone']:.1f} | "
              f"{r['s_shared']:.1f} | {r['speedup']:.2f}x | {r['max_state_diff']:.1e} | {dp} |")
    return 0


if __name__ == "__main__":
    from escrag.runtime import tune_process

    tune_process()
    raise SystemExit(main())
