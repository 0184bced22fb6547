"""The run folder's layout: where every stage reads and writes by default.

Owns: ``RunPaths`` and ``run_paths``, the one place these paths are spelt.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from escrag.config.schema import Config


@dataclasses.dataclass(frozen=True)
class RunPaths:
    """Where every stage reads and writes by default: the one place these paths are spelt."""

    index: Path  # retriever.index_dir, else <output_dir>/index
    pairs: Path  # reward.pairs, else <output_dir>/prefs/silver_pairs.jsonl (bootstrapped)
    rm: Path  # reward.head_dir, else <output_dir>/rm
    sft: Path  # <output_dir>/sft: the cold-start policy
    grpo: Path  # <output_dir>/grpo: the GRPO run of the pipeline (metrics, checkpoints, policy/)
    manifest: Path  # <output_dir>/pipeline.json: finished stages and their config keys


def run_paths(cfg: Config) -> RunPaths:
    root = Path(cfg.run.output_dir)
    return RunPaths(index=Path(cfg.retriever.index_dir) if cfg.retriever.index_dir else root / "index",
                    pairs=Path(cfg.reward.pairs) if cfg.reward.pairs else root / "prefs" / "silver_pairs.jsonl",
                    rm=Path(cfg.reward.head_dir) if cfg.reward.head_dir else root / "rm",
                    sft=root / "sft", grpo=root / "grpo", manifest=root / "pipeline.json")
