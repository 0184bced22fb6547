"""Config presets load into typed dataclasses; unknown keys, wrong types and out-of-range values fail
at load with the key path. Run: .venv/bin/python -m pytest -q tests/test_config.py"""

from pathlib import Path

import pytest

from escrag.config import Config, ConfigError, load_config

CONFIGS = Path(__file__).resolve().parent.parent / "configs"


@pytest.mark.parametrize("name", ["cpu-demo", "cpu-test", "paper-3b", "paper-7b"])
def test_presets_load(name):
    cfg = load_config(CONFIGS / f"{name}.yaml")
    assert isinstance(cfg, Config) and cfg.run.name == name


def test_paper_presets_carry_table4():
    for name, gpus in (("paper-3b", 2), ("paper-7b", 4)):
        cfg = load_config(CONFIGS / f"{name}.yaml")
        assert (cfg.grpo.batch_states, cfg.grpo.epochs, cfg.grpo.lr, cfg.grpo.kl_coef) == (128, 2, 1e-6, 0.05)
        assert (cfg.rollout.group_size, cfg.retriever.k, cfg.rollout.temperature, cfg.rollout.top_p) == (
            4, 3, 0.9, 0.95)
        assert (cfg.reward.epochs, cfg.reward.lr, cfg.reward.grad_accum, cfg.reward.center_coef) == (
            5, 5e-5, 16, 0.01)
        assert cfg.rollout.num_workers == gpus and cfg.policy.model.startswith("Qwen/Qwen2.5")


def write(tmp_path, text):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return p


@pytest.mark.parametrize("text,needle", [
    ("grpo:\n  clipeps: 0.2\n", "grpo.clipeps: unknown key"),
    ("bogus: 1\n", "bogus: unknown key"),
    ("grpo:\n  clip_eps: 3.0\n", "grpo.clip_eps: must be <= 1"),
    ("grpo:\n  batch_states: 0\n", "grpo.batch_states: must be >= 1"),
    ("grpo:\n  batch_states: many\n", "grpo.batch_states: expected int"),
    ("rollout:\n  rag: 3\n", "rollout.rag: expected bool"),
    ("rollout:\n  engine: tgi\n", "rollout.engine: must be one of"),
    ("policy:\n  lora: [1]\n", "policy.lora: expected a mapping"),
    ("policy:\n  lora:\n    target_modules: q_proj\n", "policy.lora.target_modules: expected a list"),
    ("- 1\n", "top level must be a mapping"),
    ("grpo: [\n", "invalid YAML"),
])
def test_bad_config_names_key(tmp_path, text, needle):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert needle in str(err.value) and str(path) in str(err.value)


def test_overrides_and_numeric_coercion(tmp_path):
    cfg = load_config(write(tmp_path, "grpo:\n  lr: 1e-6\n"), ["grpo.kl_coef=0", "rollout.rag=false"])
    assert cfg.grpo.lr == 1e-6 and isinstance(cfg.grpo.kl_coef, float) and cfg.grpo.kl_coef == 0.0
    assert cfg.rollout.rag is False
    with pytest.raises(ConfigError, match="grpo.nope: unknown key"):
        load_config(None, ["grpo.nope=1"])
    with pytest.raises(ConfigError, match="section.key=value"):
        load_config(None, ["grpo.lr"])


def test_missing_file():
    with pytest.raises(ConfigError, match="config file not found"):
        load_config("/nonexistent.yaml")
