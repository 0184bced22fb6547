"""Config presets load into pydantic-validated dataclasses; unknown keys, wrong types and out-of-range
values fail at load (file or -o override) with the key path; dataclasses.replace validates too; every
field has help text, which `escrag config show` prints. Run: .venv/bin/python -m pytest -q tests/test_config.py"""

import dataclasses
import importlib.util
import typing
from pathlib import Path

import pydantic
import pytest

from escrag.config import Config, ConfigError, GrpoConfig, from_dict, load_config, to_dict

pytestmark = pytest.mark.unit

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


@pytest.mark.parametrize("override,needle", [
    ("policy.lora.bogus=1", "policy.lora.bogus: unknown key (known: alpha, dropout, enabled, r, target_modules)"),
    ("endpoints={judge: {bogus: 1}}", "endpoints.judge.bogus: unknown key"),
    ("rollout.top_p=2", "rollout.top_p: must be <= 1"),
    ("eval.systems=[{name: a, k: 0}]", "eval.systems[0].k: must be >= 1, got 0"),
    ("grpo.batch_states=true", "grpo.batch_states: expected int, got bool True"),
    ("grpo.batch_states=3.0", "grpo.batch_states: expected int, got float 3.0"),
    ("grpo.lr=true", "grpo.lr: expected float, got bool True"),
    ("run.name=3", "run.name: expected str, got int 3"),
    ("safety.conv_layers=[a]", "safety.conv_layers[0]: expected int, got str 'a'"),
    ("rollout.dtype=fp8", "rollout.dtype: must be one of ['auto', 'float32', 'bfloat16', 'float16'], got 'fp8'"),
])
def test_bad_override_names_key(tmp_path, override, needle):
    path = write(tmp_path, "grpo:\n  lr: 1e-6\n")
    with pytest.raises(ConfigError) as err:
        load_config(path, [override])
    assert str(err.value).startswith(f"{path}: ") and needle in str(err.value)


def test_sections_stay_validated_dataclasses():
    cfg = load_config()
    assert from_dict(to_dict(cfg)) == cfg == Config()
    grpo = dataclasses.replace(cfg.grpo, clip_eps=0.3, lr=1)
    assert grpo.clip_eps == 0.3 and isinstance(grpo.lr, float)
    with pytest.raises(pydantic.ValidationError):
        dataclasses.replace(cfg.grpo, clip_eps=3.0)
    with pytest.raises(pydantic.ValidationError):
        GrpoConfig(clipeps=0.2)


def _sections(cls, seen):
    """``cls`` and every section class under it (mappings' values and lists' items included)."""
    seen.add(cls)
    for tp in typing.get_type_hints(cls).values():
        for sub in (tp, *typing.get_args(tp)):
            if dataclasses.is_dataclass(sub) and sub not in seen:
                _sections(sub, seen)
    return seen


def test_every_field_has_help():
    classes = _sections(Config, set())
    assert len(classes) >= 20
    missing = [f"{cls.__name__}.{f.name}" for cls in classes for f in dataclasses.fields(cls)
               if not (cls.__pydantic_fields__[f.name].description or "").strip()]
    assert missing == []


def test_config_show_prints_help(capsys):
    from escrag.cli import main

    assert main(["config", "show", str(CONFIGS / "cpu-demo.yaml"), "-o", "grpo.clip_eps=0.25"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert 'run.name: "cpu-demo"  # the run\'s name (each preset names itself after its file)' in out
    assert "grpo.clip_eps: 0.25  # δ of eq. 11" in out
    assert "policy.lora.r: 16  # LoRA rank" in out and "# policy.lora: LoRA adapters of the learner and SFT" in out


def test_config_show_bad_file_is_one_line(tmp_path, capsys):
    from escrag.cli import main

    path = write(tmp_path, "grpo:\n  clip_eps: 3.0\n")
    assert main(["config", "show", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"{path}: grpo.clip_eps: must be <= 1" in err


@pytest.mark.parametrize("fast", [True, False])
def test_auto_dtypes_take_bfloat16_only_where_it_is_fast_and_are_resolved_where_used(monkeypatch, fast):
    """``policy.dtype``, ``reward.dtype`` (the CPU demo's: auto) and ``safety.conv_dtype: auto`` stay
    ``auto`` in the loaded config and resolve where they are used (``compute_dtype``, ``conv_dtype``) to
    bfloat16 only where bfloat16 matmuls are fast (the probe of the CPU's flags stands in for the machine
    here), else float32: a config loaded on one machine resolves on the one that computes. A dtype given is
    kept either way; the placement plan, made for GPUs, counts auto as bfloat16."""
    import escrag.models
    from escrag.safety.backbone import conv_dtype
    from trainer.placement import gpu_dtype

    monkeypatch.setattr(escrag.models, "fast_bfloat16", lambda device: not fast)
    demo = load_config(CONFIGS / "cpu-demo.yaml")  # loaded where the probe says the opposite
    monkeypatch.setattr(escrag.models, "fast_bfloat16", lambda device: fast)
    want = "bfloat16" if fast else "float32"
    assert (demo.policy.dtype, demo.reward.dtype) == ("auto", "auto")
    assert demo.policy.compute_dtype == want and demo.reward.compute_dtype == want and conv_dtype(demo.safety) == want
    assert gpu_dtype(demo.policy.dtype) == "bfloat16"
    test = load_config(CONFIGS / "cpu-test.yaml")
    assert (test.policy.compute_dtype, test.reward.compute_dtype) == ("float32", "float32")
    fixed = load_config(CONFIGS / "cpu-demo.yaml", ["policy.dtype=bfloat16", "reward.dtype=float32",
                                                    "safety.conv_dtype=float32"])
    assert (fixed.policy.compute_dtype, fixed.reward.compute_dtype, conv_dtype(fixed.safety)) == \
        ("bfloat16", "float32", "float32")


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_a_vllm_engine_without_vllm_fails_at_load_with_the_install_command():
    """``rollout.engine: vllm`` where vLLM is not installed stops the job before anything starts, naming
    the key and how to install it (rollout/engines/vllm_engine.py ``check_config``), not with an
    ImportError from inside a Ray worker."""
    from rollout.engines.vllm_engine import check_config

    check_config(load_config("configs/cpu-test.yaml"))  # the transformers engine: nothing to check
    with pytest.raises(ConfigError, match=r"rollout.engine: vllm is not installed .*make install-vllm"):
        check_config(load_config("configs/cpu-test.yaml", ["rollout.engine=vllm"]))
