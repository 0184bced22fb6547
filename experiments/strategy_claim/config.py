"""The strategy-claim job's config: the run's ``Config`` plus its ``claim:`` section (the experiment's,
not the library's)."""

from __future__ import annotations

from pathlib import Path

from escrag.config import Config, Int, Str, load_config, option, section, subsection


@section
class ClaimConfig:
    """experiments/strategy_claim/README.md: the arms, their seeds and the held-out states."""
    seeds: list[Int] = option([0, 1], "training seeds of every trained arm")
    arms: list[Str] = option(["vanilla", "escrag", "escrag-stage1"], "trained arms (vanilla is also scored with RAG)")
    valid_states: Int = option(40, "valid states (seeded sample, one answer each): for choosing recipes", ge=1)
    test_states: Int = option(200, "test states (seeded sample fixed before training, one answer each)", ge=1)


@section
class ClaimRun(Config):
    claim: ClaimConfig = subsection(ClaimConfig, "the strategy-claim job (experiments/strategy_claim/job.py)")


def load(path: str | Path, overrides: list[str] = ()) -> ClaimRun:
    return load_config(path, overrides, schema=ClaimRun)
