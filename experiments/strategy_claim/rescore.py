"""The strategy_claim answers scored by the training reward model and by the independent MiniLM proxy.

    python -m experiments.strategy_claim.rescore --rm DIR [--answers runs/strategy-claim/answers.jsonl]

Owns: ``rescore.json`` beside the answers: per split and system the same table as the strategy reward's
(``job.summarize``), for ``rm`` (the reward head at DIR, on each answer's response text, as the reward
server scores it) and ``proxy`` (``evaluation.labels.fit_proxy``: MiniLM features, fitted on train
dialogues; the held-out answers' dialogues are checked apart from them). Neither was the training
reward of these policies: the strategy rule was.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from escrag.atomic import write_json
from escrag.errors import run_main
from experiments.strategy_claim.config import load
from experiments.strategy_claim.job import summarize


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="experiments/strategy_claim/config.yaml")
    ap.add_argument("--rm", required=True, help="a reward-head folder (escrag rm train --out DIR)")
    ap.add_argument("--answers", default="runs/strategy-claim/answers.jsonl")
    args = ap.parse_args()
    cfg = load(args.config)
    from escrag.data import load_states
    from evaluation.labels import check_disjoint, fit_proxy, rm_scorer

    records = [json.loads(line) for line in Path(args.answers).read_text().splitlines() if line]
    states = {s.state_id: s for split in ("valid", "test") for s in load_states(split)}
    pairs = [(states[r["state_id"]].history, r["response"]) for r in records]
    proxy = fit_proxy(cfg)
    check_disjoint(proxy.dialogues, {r["dialogue_id"] for r in records})
    for r, rm, px in zip(records, rm_scorer(args.rm)(pairs), proxy.score(pairs)):
        r["rm"], r["proxy"] = rm, px
    out = {"rm_dir": args.rm, "answers": args.answers,
           **{key: summarize(records, cfg, key) for key in ("rm", "proxy")}}
    path = Path(args.answers).with_name("rescore.json")
    write_json(path, out)
    for key in ("rm", "proxy"):
        for system, e in out[key]["test"].items():
            d = e.get("vs_vanilla+rag")
            print(f"{key:5s} test {system:14s} {e['mean']['states'][0]:+.3f}"
                  + (f"  vs vanilla+rag {d['states'][0]:+.3f} [{d['states'][1]:+.3f}, {d['states'][2]:+.3f}]" if d else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main("strategy_claim.rescore", main))
