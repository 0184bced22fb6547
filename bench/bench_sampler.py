"""One decode step's sampling, top-p without top-k (the paper's T 0.9 / top-p 0.95, ``top_k: 0``): ours
(``escrag.sampling.sample``) vs the same rule by a full sort of the vocabulary (the first sampler)
vs HF ``generate``'s warpers (temperature, top-p by a full sort, softmax, multinomial), one run, the
same logits, one thread; with ``--before REV``, also ``escrag/sampling.py`` as it was at commit REV
(read with ``git show``; it imports only torch), side by side in the same process.

Logits: the next-token logits of SmolLM2-135M-Instruct after the stage-1 prompts of the first ESConv
valid states (a trained model: its nucleus is small; a reply's first token has a wider one than the
tokens after it: also after 8 greedy tokens), and of the tests' tiny random Qwen2 (flat: top-p keeps
~95% of the 49,152 tokens). Batch 1, 8 and 32 rows; median of ``--repeat`` after a warm-up.
Also: how many of ours drew the full sort's token (the rule is the same; they may differ only where
rounding moves a token across the top-p boundary). Writes ``bench/results/sampler.json``.

    .venv/bin/python bench/bench_sampler.py
    .venv/bin/python bench/bench_sampler.py --before d44a742  # the sampler before the top-k-free search
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import types
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_cpu_bf16 import timed  # noqa: E402
from bench.bench_engine import prompts  # noqa: E402
from escrag.sampling import sample, uniforms  # noqa: E402

T, TOP_P = 0.9, 0.95


def full_sort(logits, seeds, steps):
    """The rule by a full sort, in float32 (escrag.sampling before the nucleus search)."""
    vals, idx = (logits.float() / T).sort(dim=-1, descending=True)
    logp = vals.log_softmax(dim=-1)
    probs = logp.exp()
    logp = logp.masked_fill(probs.cumsum(dim=-1) - probs >= TOP_P, float("-inf"))
    race = logp - torch.log(-torch.log(uniforms(seeds, steps, idx)))
    return idx.gather(-1, race.masked_fill(logp == float("-inf"), float("-inf")).argmax(-1, keepdim=True)).squeeze(-1)


def hf_warpers():
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopPLogitsWarper

    temp, top_p = TemperatureLogitsWarper(T), TopPLogitsWarper(TOP_P)

    def draw(logits, seeds, steps):
        scores = top_p(None, temp(None, logits.float()))
        return torch.multinomial(scores.softmax(dim=-1), 1).squeeze(-1)
    return draw


def next_logits(spec: str, n: int, after: int = 0) -> torch.Tensor:
    """The next-token logits after the stage-1 prompts of the first ``n`` ESConv valid states, and after
    ``after`` greedy tokens past them (a decode step's distribution rather than a reply's first token's)."""
    from escrag.models import load_causal_lm, load_tokenizer

    tok, lm = load_tokenizer(spec), load_causal_lm(spec, "float32").eval()
    with torch.inference_mode():
        if not after:
            return torch.stack([lm(torch.tensor([ids])).logits[0, -1] for ids in prompts(tok, n)])
        return torch.stack([lm.generate(torch.tensor([ids]), max_new_tokens=after + 1, do_sample=False, output_logits=True,
                                        return_dict_in_generate=True, pad_token_id=tok.eos_token_id).logits[after][0]
                            for ids in prompts(tok, n)])


def sampler_at(ref: str) -> types.ModuleType:
    """``escrag/sampling.py`` as it was at commit ``ref``, loaded as a module of its own."""
    try:
        src = subprocess.run(["git", "-C", str(ROOT), "show", f"{ref}:escrag/sampling.py"], check=True,
                             capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise SystemExit(f"bench_sampler: cannot read escrag/sampling.py at --before {ref!r} (needs git and "
                         f"the history): {e}") from None
    module = types.ModuleType(f"sampling_at_{ref}")
    exec(compile(src, f"{ref}:escrag/sampling.py", "exec"), module.__dict__)
    return module


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "sampler.json"))
    ap.add_argument("--before", help="a commit whose escrag/sampling.py is timed too")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    sources = {"SmolLM2-135M": next_logits("packaged:smollm2-135m-instruct", 32),
               "SmolLM2, 8 tokens in": next_logits("packaged:smollm2-135m-instruct", 32, after=8),
               "tiny random Qwen2": next_logits("tiny-random:qwen2", 32)}
    variants = {"ours": lambda x, s, t: sample(x, T, TOP_P, 0, s, t)[0], "full sort": full_sort, "HF warpers": hf_warpers()}
    if a.before:
        old = sampler_at(a.before)
        variants[f"at {a.before}"] = lambda x, s, t: old.sample(x, T, TOP_P, 0, s, t)[0]
    rows = []
    print(f"{'logits':<20}{'batch':>6}" + "".join(f"{v + ' ms':>15}" for v in variants)
          + f"{'vs sort':>9}{'vs HF':>8}{'same token':>12}" + (f"{'vs ' + a.before:>12}" if a.before else ""))
    for name, logits in sources.items():
        for batch in (1, 8, 32):
            x = logits[:batch].contiguous()
            seeds, steps = torch.arange(batch) * 7919, torch.zeros(batch, dtype=torch.long)
            ms = {v: timed(lambda f=f, x=x, s=seeds, t=steps: f(x, s, t), a.repeat) for v, f in variants.items()}
            many = logits.repeat(40, 1)[: 40 * batch]
            many_seeds, many_steps = torch.arange(len(many)), torch.arange(len(many)) % 7
            same = (variants["ours"](many, many_seeds, many_steps) == full_sort(many, many_seeds, many_steps)).float().mean()
            rows.append({"logits": name, "batch": batch, "ms": ms, "same_token": round(float(same), 4)})
            print(f"{name:<20}{batch:>6}" + "".join(f"{ms[v]:>15.2f}" for v in variants)
                  + f"{ms['full sort'] / ms['ours']:>8.1f}x{ms['HF warpers'] / ms['ours']:>7.1f}x{float(same):>12.4f}"
                  + (f"{ms[f'at {a.before}'] / ms['ours']:>11.2f}x" if a.before else ""))
    Path(a.out).write_text(json.dumps({"torch": torch.__version__, "threads": 1, "temperature": T, "top_p": TOP_P,
                                       "before": a.before, "rows": rows}, indent=2) + "\n")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    from escrag.runtime import tune_process

    tune_process()
    sys.exit(main())
