"""The mechanism task's config: the run's ``Config`` plus its ``mechanism:`` section.

Owns: ``MechanismConfig`` and ``MechanismRun`` (the schema its presets load with, ``load``). The section
is the experiment's, not the library's: ``escrag.config.Config`` knows nothing of it.
"""

from __future__ import annotations

from pathlib import Path

from escrag.config import Config, Float, Int, Str, load_config, option, section, subsection


@section
class MechanismConfig:
    """The built-in task where the reward is in the exemplars only (experiments/mechanism/task.py, README.md)."""
    train_world: Int = option(1, "seed of the topic -> code word table of training (index and reward)")
    valid_world: Int = option(2, "seed of the valid table (a derangement of train's: memorising train pays nothing)")
    test_world: Int = option(3, "seed of the test table (a derangement of train's)")
    shuffle_seed: Int = option(7, "seed of the control's index: each topic's exemplar shows another topic's code")
    valid_states: Int = option(24, "held-out valid states (topic x held-out message templates)", ge=1)
    test_states: Int = option(48, "held-out test states", ge=1)
    eval_samples: Int = option(2, "answers per held-out state and policy (same seeds across arms)", ge=1)
    sft_examples: Int = option(512, "two-stage demonstrations (draft + final) of the SFT start", ge=1)
    sft_topic_rate: Float = option(0.3, "share of demonstration drafts that name the topic (the rest are generic)",
                               ge=0.0, le=1.0)
    sft_code_rate: Float = option(0.5, "share of demonstration drafts that end with a random code word (what "
                              "Vanilla-GRPO can explore and memorise)", ge=0.0, le=1.0)
    seeds: list[Int] = option([0, 1], "training seeds of every arm")
    arms: list[Str] = option(["vanilla", "escrag", "escrag-stage1", "shuffled"],
                         "trained arms (vanilla is also scored with RAG inference)")


@section
class MechanismRun(Config):
    mechanism: MechanismConfig = subsection(MechanismConfig, "the mechanism task (experiments/mechanism/job.py)")


def load(path: str | Path, overrides: list[str] = ()) -> MechanismRun:
    """A mechanism preset with overrides; errors name the file and key as ``escrag.config.load_config``'s."""
    return load_config(path, overrides, schema=MechanismRun)
