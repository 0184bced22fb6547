"""The MiniLM proxy on each run's comparison answers: is GRPO's gain only longer answers, and what do the
seeds say together? Runs: this folder (seed 0) and each ``seed-N/`` (``SEED=N run.sh``).

    .venv/bin/python experiments/heldout_gain/recipe-rm/length.py     (after run.sh)

Writes ``length.json`` beside this file. Per run: words per answer (median per policy and the paired
difference), the correlation of proxy score and log word count over all answers, and the paired
GRPO - SFT difference of the raw and of the length-residual scores (a linear fit on log words, pooled over
both policies). ``pooled``: each state's GRPO - SFT difference averaged over the runs (they answer the same
test states with the same seeds), bootstrap over states. The proxy is fitted once (config.yaml's seed).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
HERE = Path(__file__).resolve().parent


def judge(folder: Path, proxy, states, ci) -> tuple[dict, dict[str, float]]:
    """One run's summary, and each state's GRPO - SFT proxy difference."""
    from evaluation.compare import block, per_state

    records = [json.loads(ln) for ln in (folder / "compare-test.jsonl").read_text().splitlines() if ln]
    scores = np.array(proxy.score([(states[r["state_id"]].history, r["response"]) for r in records]))
    words = np.array([max(len(r["response"].split()), 1) for r in records], dtype=float)
    x = np.log(words)
    slope, icpt = np.polyfit(x, scores, 1)
    for r, s, w, res in zip(records, scores, words, scores - (slope * x + icpt)):
        r["proxy"], r["words"], r["proxy_length_residual"] = float(s), float(w), float(res)
    recs = {n: [r for r in records if r["policy"] == n] for n in ("sft", "grpo")}
    out = {"answers": {n: len(rs) for n, rs in recs.items()},
           "median_words": {n: float(np.median([r["words"] for r in rs])) for n, rs in recs.items()},
           "words": block(recs, "words", ci), "corr_proxy_log_words": float(np.corrcoef(x, scores)[0, 1]),
           "fit": {"slope_per_log_word": float(slope), "intercept": float(icpt)},
           "proxy": block(recs, "proxy", ci), "proxy_length_residual": block(recs, "proxy_length_residual", ci)}
    sft, grpo = per_state(recs["sft"], "proxy"), per_state(recs["grpo"], "proxy")
    return out, {s: grpo[s] - sft[s] for s in sft if s in grpo}


def main() -> None:
    from escrag.atomic import write_json
    from escrag.config import load_config
    from escrag.data import load_states
    from escrag.stats import bootstrap_ci
    from evaluation.labels import check_disjoint, fit_proxy

    cfg = load_config(HERE / "config.yaml")
    ci = (cfg.eval.bootstrap, cfg.eval.ci, cfg.run.seed)
    states = {s.state_id: s for s in load_states("test")}
    proxy = fit_proxy(cfg)
    check_disjoint(proxy.dialogues, {s.dialogue_id for s in states.values()})
    runs = {"seed-0": HERE, **{p.name: p for p in sorted(HERE.glob("seed-*")) if (p / "compare-test.jsonl").is_file()}}
    out, deltas = {"runs": {}}, {}
    for name, folder in runs.items():
        out["runs"][name], deltas[name] = judge(folder, proxy, states, ci)
        print(name, "proxy delta", out["runs"][name]["proxy"]["delta"])
    shared = sorted(set.intersection(*(set(d) for d in deltas.values())))
    out["pooled"] = {"runs": list(runs), "states": len(shared),
                     "proxy_delta": bootstrap_ci([np.mean([d[s] for d in deltas.values()]) for s in shared], *ci)}
    write_json(HERE / "length.json", out)
    print("pooled proxy delta", out["pooled"]["proxy_delta"])


if __name__ == "__main__":
    main()
