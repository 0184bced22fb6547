"""Is the proxy's GRPO - SFT gain only longer answers? The MiniLM proxy's scores of the comparison's answers,
with and without the part a linear fit on log word count explains (pooled over both policies).

    .venv/bin/python experiments/heldout_gain/recipe-rm/length.py     (after run.sh)

Writes ``length.json`` beside this file: words per answer (median per policy and the paired difference),
the correlation of proxy score and log words over all answers, and the paired GRPO - SFT difference of the
raw and of the length-residual scores (bootstrap over states, as ``escrag eval labels --answers``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
HERE = Path(__file__).resolve().parent


def main() -> None:
    from escrag.atomic import write_json
    from escrag.config import load_config
    from escrag.data import load_states
    from evaluation.compare import block
    from evaluation.labels import check_disjoint, fit_proxy

    cfg = load_config(HERE / "config.yaml")
    records = [json.loads(ln) for ln in (HERE / "compare-test.jsonl").read_text().splitlines() if ln]
    states = {s.state_id: s for s in load_states("test")}
    proxy = fit_proxy(cfg)
    check_disjoint(proxy.dialogues, {states[r["state_id"]].dialogue_id for r in records})
    scores = np.array(proxy.score([(states[r["state_id"]].history, r["response"]) for r in records]))
    words = np.array([max(len(r["response"].split()), 1) for r in records], dtype=float)
    x = np.log(words)
    slope, icpt = np.polyfit(x, scores, 1)
    for r, s, w, res in zip(records, scores, words, scores - (slope * x + icpt)):
        r["proxy"], r["words"], r["proxy_length_residual"] = float(s), float(w), float(res)
    recs = {n: [r for r in records if r["policy"] == n] for n in ("sft", "grpo")}
    ci = (cfg.eval.bootstrap, cfg.eval.ci, cfg.run.seed)
    out = {"answers": {n: len(rs) for n, rs in recs.items()},
           "median_words": {n: float(np.median([r["words"] for r in rs])) for n, rs in recs.items()},
           "words": block(recs, "words", ci),
           "corr_proxy_log_words": float(np.corrcoef(x, scores)[0, 1]),
           "fit": {"slope_per_log_word": float(slope), "intercept": float(icpt)},
           "proxy": block(recs, "proxy", ci), "proxy_length_residual": block(recs, "proxy_length_residual", ci)}
    write_json(HERE / "length.json", out)
    print(json.dumps({k: out[k] for k in ("median_words", "corr_proxy_log_words")}),
          "\nproxy delta", out["proxy"]["delta"], "\nresidual delta", out["proxy_length_residual"]["delta"])


if __name__ == "__main__":
    main()
