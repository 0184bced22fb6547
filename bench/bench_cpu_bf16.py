"""bfloat16 on a CPU: PyTorch's own bfloat16 linear vs ``escrag.bf16cpu``'s float32-emulated one (and
float32 for scale), one run, the same tensors.

    .venv/bin/python bench/bench_cpu_bf16.py               # the torch threads of this process
    .venv/bin/python bench/bench_cpu_bf16.py --threads 1   # as one pytest-xdist worker of two has

Rows: single linears at the shapes that cost the most here (the tiny test model's LM head over a
2,048-token batch; SmolLM2-135M's MLP and LM head at prefill and decode row counts) with bfloat16
weights, and one SFT step (forward + backward, ``torch.autocast`` bfloat16, float32 weights) of the
tiny random Qwen2 over 4 x 128 tokens. Median of ``--repeat`` after one warm-up. On a CPU with AMX /
AVX512-BF16 the project keeps the native linear (``fast_bfloat16``), so there the table only says
what it leaves alone. Writes ``bench/results/cpu_bf16.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from escrag.bf16cpu import EmulatedBF16Linear
from escrag.models import fast_bfloat16, load_causal_lm

ROOT = Path(__file__).resolve().parent.parent
LINEARS = [  # (name, rows, in, out)
    ("tiny LM head, 2,048 tokens", 2048, 64, 49152),
    ("SmolLM2 MLP up, 512 tokens", 512, 576, 1536),
    ("SmolLM2 LM head, 128 tokens", 128, 576, 49152),
    ("SmolLM2 MLP up, 8-row decode", 8, 576, 1536),
    ("SmolLM2 LM head, 8-row decode", 8, 576, 49152),
]


def timed(fn, repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def linear_row(name, rows, k, n, repeat) -> dict:
    torch.manual_seed(0)
    x = torch.randn(rows, k).bfloat16()
    plain = torch.nn.Linear(k, n, bias=False).bfloat16()
    emulated = torch.nn.Linear(k, n, bias=False).bfloat16()
    emulated.load_state_dict(plain.state_dict())
    emulated.__class__ = EmulatedBF16Linear
    f32 = torch.nn.Linear(k, n, bias=False)
    with torch.no_grad():
        return {"case": name, "native_bf16_ms": timed(lambda: plain(x), repeat),
                "emulated_bf16_ms": timed(lambda: emulated(x), repeat),
                "float32_ms": timed(lambda: f32(x.float()), repeat)}


def sft_row(repeat) -> dict:
    ids = torch.randint(100, 49152, (4, 128), generator=torch.Generator().manual_seed(0))
    out = {"case": "tiny Qwen2 SFT step, 4 x 128 (autocast)"}
    for side in ("native_bf16", "emulated_bf16", "float32"):
        model = load_causal_lm("tiny-random:qwen2", "float32")
        for m in model.modules():
            if isinstance(m, torch.nn.Linear):
                m.__class__ = EmulatedBF16Linear if side == "emulated_bf16" else torch.nn.Linear

        def step(model=model, on=side != "float32"):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=on):
                logits = model(ids).logits
            loss = torch.nn.functional.cross_entropy(logits[:, :-1].float().flatten(0, 1), ids[:, 1:].flatten())
            loss.backward()

        out[f"{side}_ms"] = timed(step, repeat)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: as the process has)")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "cpu_bf16.json"))
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    rows = [linear_row(*spec, a.repeat) for spec in LINEARS] + [sft_row(a.repeat)]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, fast bfloat16: {fast_bfloat16('cpu')}")
    print(f"{'case':42s} {'native bf16':>12s} {'emulated':>10s} {'float32':>10s} {'speed-up':>9s}")
    for r in rows:
        r["speedup"] = r["native_bf16_ms"] / r["emulated_bf16_ms"]
        print(f"{r['case']:42s} {r['native_bf16_ms']:10.1f}ms {r['emulated_bf16_ms']:8.1f}ms "
              f"{r['float32_ms']:8.1f}ms {r['speedup']:8.1f}x")
    Path(a.out).write_text(json.dumps({"torch": torch.__version__, "threads": torch.get_num_threads(),
                                       "fast_bfloat16": fast_bfloat16("cpu"), "rows": rows}, indent=2) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    from escrag.runtime import tune_process

    tune_process()
    main()
