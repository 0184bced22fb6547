"""The strategy claim's SFT start, chosen on valid (README.md, "The SFT start").

    python -m experiments.strategy_claim.sft_valid [--config experiments/strategy_claim/config.yaml]

Owns: ``sft-valid.json``. Each candidate recipe (``CANDIDATES``: how many bootstrapped demonstrations,
how many passes) trains an SFT start and answers the job's seeded **valid** states, with and without
RAG, as the job's ``sft`` / ``sft+rag`` systems do. The rule, written before it ran: the candidate
whose think blocks name exactly one ESConv strategy most often over those answers (a start GRPO can
climb from: the strategy reward pays nothing otherwise); within 0.05 of the best, the fewest SFT steps.
Test is never read here.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from escrag.atomic import write_json
from escrag.errors import run_main
from experiments.strategy_claim.config import load

CANDIDATES = {  # name -> sft overrides; "64x1" is the start of the first run (results/ before this choice)
    "64x1": ["sft.num_examples=64", "sft.epochs=1"],
    "256x1": ["sft.num_examples=256", "sft.epochs=1"],
    "512x1": ["sft.num_examples=512", "sft.epochs=1"],
}


def probe(cfg, name: str, retriever, log) -> dict:
    from experiments.strategy_claim.job import eval_jobs, score_policy
    from rollout.engines import make_engine
    from trainer.sft import train_sft

    t = time.time()
    sft = train_sft(cfg, out=Path(cfg.run.output_dir) / "sft", log=log)
    engine = make_engine(cfg, model_spec=sft["path"], seed=cfg.run.seed)
    jobs = eval_jobs(cfg, "valid")
    recs = [r for system in ("sft", "sft+rag") for r in score_policy(cfg, engine, system, None, "valid", jobs, retriever)]
    n = len(recs)
    row = {"name": name, "overrides": CANDIDATES[name], "steps": len(sft["losses"]), "answers": n,
           "exactly_one": sum(len(r["named"]) == 1 for r in recs) / n,
           "strategy": sum(r["strategy"] for r in recs) / n, "format": sum(r["format"] for r in recs) / n,
           "final_loss": sft["losses"][-1], "seconds": round(time.time() - t, 1)}
    log(f"[sft-valid] {json.dumps(row)}")
    return row


def choose(rows: list[dict]) -> str:
    best = max(r["exactly_one"] for r in rows)
    return min((r for r in rows if r["exactly_one"] >= best - 0.05), key=lambda r: r["steps"])["name"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.strategy_claim.sft_valid", description=__doc__.splitlines()[0])
    p.add_argument("--config", default="experiments/strategy_claim/config.yaml")
    p.add_argument("--out", default="experiments/strategy_claim/sft-valid.json")
    args = p.parse_args(argv)

    def go() -> int:
        from experiments.strategy_claim.job import IndexRetriever

        base = load(args.config)
        retriever = IndexRetriever(base)
        index = str(Path(base.run.output_dir) / "index")
        rows = [probe(load(args.config, [*o, f"run.output_dir=runs/strategy-claim-sft/{name}",
                                         f"retriever.index_dir={index}"]), name, retriever, print)
                for name, o in CANDIDATES.items()]
        chosen = choose(rows)
        write_json(Path(args.out), {"split": "valid", "valid_states": base.claim.valid_states, "rows": rows,
                                    "rule": "most think blocks naming exactly one strategy; within 0.05, fewest steps",
                                    "chosen": chosen})
        print(f"chosen: {chosen} ({' '.join(CANDIDATES[chosen])})")
        return 0

    return run_main("strategy_claim.sft_valid", go)


if __name__ == "__main__":
    sys.exit(main())
