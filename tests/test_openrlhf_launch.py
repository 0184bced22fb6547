"""The OpenRLHF launcher: every flag it emits for the paper presets and the one-GPU smoke preset is
accepted by the pinned ``openrlhf/cli/train_ppo_ray.py`` parser (rebuilt from its source with ``ast``,
choices and types checked, no abbreviations) and carries our numbers; flags from OpenRLHF's README
that its parser no longer has are refused; the pin agrees across pyproject, the launcher and the
installed package; ``--dry-run`` prints exactly the command on one line and writes nothing; settings
OpenRLHF cannot express fail with their key; the prompt dataset is read by OpenRLHF's own
``PromptDataset`` into our stage-1 prompt and the agent's label.
Run: .venv/bin/python -m pytest -q tests/test_openrlhf_launch.py"""

import importlib.metadata
import importlib.util
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from escrag.config import ConfigError, load_config
from escrag.errors import UserError
from trainer import openrlhf_launch as orl

ROOT = Path(__file__).resolve().parent.parent
pytest.importorskip("openrlhf", reason="make install adds the no-deps OpenRLHF these tests read")
GPUS = {"paper-7b": 4, "paper-3b": 2, "gpu-smoke": 1}


def _cfg(preset, *overrides):
    return load_config(ROOT / "configs" / f"{preset}.yaml", list(overrides))


@pytest.fixture(scope="module")
def parser():
    return orl.parser_from_source()


@pytest.mark.parametrize("preset", sorted(GPUS))
def test_emitted_flags_parse_and_carry_our_numbers(parser, preset):
    cfg = _cfg(preset)
    argv = orl.build_argv(cfg)
    known = {s for a in parser._actions for s in a.option_strings}
    assert {t for t in argv if t.startswith("--")} <= known
    a = orl.check_argv(argv, parser)
    g, ro, gpus = cfg.grpo, cfg.rollout, GPUS[preset]
    assert (a["algo.advantage.estimator"], a["rollout.n_samples_per_prompt"]) == ("group_norm", ro.group_size)
    assert (a["algo.kl.use_loss"], a["algo.kl.estimator"], a["algo.kl.init_coef"]) == (True, "k3", g.kl_coef)
    assert (a["actor.adam.lr"], a["actor.eps_clip"], a["actor.policy_loss_type"]) == (g.lr, 0.2, "ppo")
    assert (a["rollout.batch_size"], a["train.batch_size"]) == (g.batch_states, g.batch_states * ro.group_size)
    assert (a["rollout.temperature"], a["rollout.top_p"]) == (ro.temperature, ro.top_p)
    assert a["train.num_episodes"] == (1 if g.steps else g.epochs) and a["train.max_epochs"] == 1
    assert a["actor.num_gpus_per_node"] == a["ref.num_gpus_per_node"] == a["vllm.num_engines"] == gpus
    assert a["train.colocate_all"] and a["vllm.enable_sleep"] and a["ds.param_dtype"] == "bf16"
    assert a["actor.lr_scheduler"] == "constant" and a["actor.adam.betas"] == [0.9, 0.999]
    assert Path(a["train.agent_func_path"]) == ROOT / "rollout" / "openrlhf_agent.py"
    assert a["actor.model_name_or_path"] == str((ROOT / cfg.run.output_dir / "sft").resolve())
    assert (a["data.input_key"], a["data.label_key"]) == (orl.INPUT_KEY, orl.LABEL_KEY)
    assert a["reward.model_name_or_path"] is None and a["critic.model_name_or_path"] is None


def test_paper_presets_table4(parser):
    for preset in ("paper-7b", "paper-3b"):
        a = orl.check_argv(orl.build_argv(_cfg(preset)), parser)
        assert (a["actor.adam.lr"], a["rollout.batch_size"], a["train.num_episodes"], a["algo.kl.init_coef"]) == (
            1e-6, 128, 2, 0.05)
        assert (a["rollout.n_samples_per_prompt"], a["rollout.temperature"], a["rollout.top_p"]) == (4, 0.9, 0.95)


def test_parser_is_the_pinned_source(parser):
    """Options built in a loop from f-strings are there; README-era flags, a bad choice, a bad type and
    an abbreviation are refused, each with its name."""
    orl.check_argv(["--critic.adam.lr", "1e-5", "--actor.muon.no_nesterov", "--train.colocate_all"], parser)
    for argv, word in ((["--prompt_max_len", "1024"], "--prompt_max_len"),
                       (["--generate_max_len", "1024"], "--generate_max_len"),
                       (["--algo.kl.estimator", "k4"], "invalid choice"),
                       (["--actor.adam.lr", "fast"], "invalid float"),
                       (["--ckpt.load"], "--ckpt.load")):
        with pytest.raises(UserError, match=re.escape(word)):
            orl.check_argv(argv, parser)
    assert len(parser._actions) > 150


def test_one_pin_everywhere():
    text = (ROOT / "pyproject.toml").read_text()
    assert f'"openrlhf[vllm]=={orl.OPENRLHF_VERSION}"' in text
    assert importlib.metadata.version("openrlhf") == orl.OPENRLHF_VERSION
    make = subprocess.run(["make", "-s", "-p", "-n", "lint"], cwd=ROOT, capture_output=True, text=True).stdout
    assert f"OPENRLHF := openrlhf=={orl.OPENRLHF_VERSION}" in make


def test_dry_run_prints_the_exact_command_and_writes_nothing(tmp_path, parser):
    out = tmp_path / "run"
    args = ["--backend", "openrlhf", "--config", "configs/paper-7b.yaml", "--dry-run", "-o", f"run.output_dir={out}"]
    res = subprocess.run([sys.executable, "-m", "ray_jobs.train_grpo", *args], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.strip().splitlines()
    assert len(lines) == 1 and not out.exists()
    cfg = _cfg("paper-7b", f"run.output_dir={out}")
    assert lines[0] == orl.one_line(orl.command(cfg), {"RAY_ADDRESS": "auto"})
    words = shlex.split(lines[0])
    assert words[:4] == ["RAY_ADDRESS=auto", sys.executable, "-m", orl.ENTRY]
    orl.check_argv(words[4:], parser)
    res = subprocess.run([sys.executable, "-m", "escrag", "grpo", *args, "--policy", "Qwen/Qwen2.5-7B-Instruct"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert "--actor.model_name_or_path Qwen/Qwen2.5-7B-Instruct " in res.stdout


@pytest.mark.parametrize("override,key", [
    ("grpo.ratio_level=sequence", "grpo.ratio_level"),
    ("policy.dtype=float32", "policy.dtype"),
    ("openrlhf.vllm_engines=3", "openrlhf.vllm_engines"),
    ("grpo.batch_states=1", "grpo.batch_states"),
])
def test_inexpressible_settings_fail_with_their_key(override, key):
    with pytest.raises(ConfigError, match=re.escape(key)):
        orl.build_argv(_cfg("paper-7b", override))


def test_without_kl_no_reference_model(parser):
    a = orl.check_argv(orl.build_argv(_cfg("paper-3b", "grpo.kl_coef=0")), parser)
    assert a["algo.kl.init_coef"] == 0 and not a["algo.kl.use_loss"]
    assert a["ref.num_gpus_per_node"] is None  # not emitted (defaults are not read from the source)


def test_resume_and_missing_sft(tmp_path, parser):
    cfg = _cfg("gpu-smoke", f"run.output_dir={tmp_path}")
    assert orl.check_argv(orl.build_argv(cfg, resume=True), parser)["ckpt.load_enable"]
    with pytest.raises(UserError, match="no SFT model yet"):
        orl.require_policy(cfg, str(orl.default_policy(cfg)))
    (tmp_path / "sft").mkdir()
    orl.require_policy(cfg, str(orl.default_policy(cfg)))


def test_dataset_states_follow_the_local_sampler():
    from trainer.sampler import StateSampler

    states = list(range(10))
    cfg = _cfg("gpu-smoke", "grpo.steps=3", "grpo.batch_states=4")
    sampler = StateSampler(10, 4, cfg.run.seed)
    assert orl.dataset_states(cfg, states) == [i for _ in range(3) for i in sampler.next_batch()]
    assert orl.dataset_states(_cfg("paper-7b"), states) == states


def test_a_resumed_run_keeps_its_prompt_order(tmp_path):
    """OpenRLHF resumes by position in the prompt file, so --resume draws it with the scheme of the file
    already there: recorded beside it, or scheme 1 for a file from before the record (the old seeding)."""
    import random

    from trainer.sampler import SCHEME

    cfg = _cfg("gpu-smoke", f"run.output_dir={tmp_path}", "grpo.steps=2", "grpo.batch_states=4")
    prompts = orl.prompts_path(cfg)
    assert orl.sampler_scheme(cfg, resume=True) == SCHEME  # nothing written yet
    prompts.parent.mkdir(parents=True)
    prompts.write_text("{}\n")  # a file from before the scheme was recorded
    assert orl.sampler_scheme(cfg, resume=True) == 1 and orl.sampler_scheme(cfg, resume=False) == SCHEME
    old = list(range(10))
    random.Random(cfg.run.seed * 100_003).shuffle(old)  # the old formula, epoch 0
    assert orl.dataset_states(cfg, list(range(10)), scheme=1) == old[:8]
    prompts.with_suffix(".meta.json").write_text('{"sampler_scheme": 2}\n')
    assert orl.sampler_scheme(cfg, resume=True) == 2
