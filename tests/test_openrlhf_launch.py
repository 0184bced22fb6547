"""The OpenRLHF launcher: every flag it emits for the paper presets and the one-GPU smoke preset is
accepted by the pinned ``openrlhf/cli/train_ppo_ray.py`` parser (rebuilt from its source with ``ast``,
choices and types checked, no abbreviations) and carries our numbers; flags from OpenRLHF's README
that its parser no longer has are refused; the pin agrees across pyproject, the launcher and the
installed package; ``--dry-run`` prints the placement plan and the prompt files' rows and ends with the
command; settings
OpenRLHF cannot express fail with their key; the prompt dataset is read by OpenRLHF's own
``PromptDataset`` into our stage-1 prompt and the agent's label.
Run: .venv/bin/python -m pytest -q tests/test_openrlhf_launch.py"""

import importlib.metadata
import importlib.util
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from escrag.config import ConfigError, load_config
from escrag.errors import UserError
from trainer.openrlhf import launch as orl

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
    assert a["train.num_episodes"] == 1 and a["train.max_epochs"] == 1  # the file holds every step's batch
    assert a["actor.num_gpus_per_node"] == a["ref.num_gpus_per_node"] == a["vllm.num_engines"] == gpus
    assert a["train.colocate_all"] and a["vllm.enable_sleep"] and a["ds.param_dtype"] == "bf16"
    assert a["actor.lr_scheduler"] == "constant" and a["actor.adam.betas"] == [0.9, 0.999]
    assert Path(a["train.agent_func_path"]) == ROOT / "trainer" / "openrlhf" / "agent.py"
    assert a["actor.model_name_or_path"] == str((ROOT / cfg.run.output_dir / "sft").resolve())
    assert (a["data.input_key"], a["data.label_key"]) == (orl.INPUT_KEY, orl.LABEL_KEY)
    assert a["reward.model_name_or_path"] is None and a["critic.model_name_or_path"] is None
    # issue 52: no best_global_stepN checkpoints outside --ckpt.max_num (the default "" auto-detects
    # eval_*_pass1 and saves one whenever it improves); gradients accumulate in fp32 like the local learner
    assert a["ckpt.best_metric_key"] == "none" and a["ds.grad_accum_dtype"] == "fp32" == cfg.openrlhf.grad_accum_dtype


def test_what_the_flags_mean_in_the_pinned_source():
    """The readings the launcher's flags rest on, checked in OpenRLHF 0.11.2's source: 'none' is the
    value that turns best checkpoints off; grad_accum_dtype reaches DeepSpeed's data_types; the prompt
    loader is built with shuffle=True (no flag) in the controller, so --train.seed does not order it."""
    src = Path(importlib.util.find_spec("openrlhf").submodule_search_locations[0])
    trainer = (src / "trainer" / "ppo_trainer.py").read_text()
    assert 'if self.best_eval_metric_key == "none":' in trainer and 'tag = f"best_global_step{global_step}"' in trainer
    assert '"data_types": {"grad_accum_dtype": grad_accum_dtype}' in (src / "utils" / "deepspeed" /
                                                                      "deepspeed_utils.py").read_text()
    assert re.search(r"prompts_dataloader = strategy\.setup_dataloader\(\s*prompts_dataset,\s*1,\s*True,\s*True,",
                     trainer)
    assert "seeds nothing" in orl.dataset_states.__doc__


def test_paper_presets_table4(parser):
    for preset in ("paper-7b", "paper-3b"):
        a = orl.check_argv(orl.build_argv(_cfg(preset)), parser)
        assert (a["actor.adam.lr"], a["rollout.batch_size"], a["algo.kl.init_coef"]) == (1e-6, 128, 0.05)
        assert len(orl.dataset_states(_cfg(preset), list(range(10_191)))) == 160 * 128  # 2 epochs, whole batches
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


def test_dry_run_prints_the_plan_writes_its_files_and_ends_with_the_command(tmp_path, parser):
    """``--dry-run`` on this CPU machine: the placement table, ``placement.json`` in the issue's shape,
    the prompt file (a whole number of rollout batches; rendered with SmolLM2's tokenizer as an estimate
    since the preset's Qwen is not here) with its path and row count, and the command on the last line."""
    out = tmp_path / "run"
    args = ["--backend", "openrlhf", "--config", "configs/gpu-smoke.yaml", "--dry-run", "-o", f"run.output_dir={out}",
            "-o", "grpo.steps=3", "-o", "grpo.eval_every=2", "-o", "grpo.eval_states=5"]
    res = subprocess.run([sys.executable, "-m", "ray_jobs.train_grpo", *args], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.strip().splitlines()
    cfg = _cfg("gpu-smoke", f"run.output_dir={out}", "grpo.steps=3", "grpo.eval_every=2", "grpo.eval_states=5")
    assert lines[-1] == orl.one_line(orl.command(cfg), {})
    a = orl.check_argv(shlex.split(lines[-1])[3:], parser)
    assert (a["eval.dataset"], a["eval.steps"], a["eval.n_samples_per_prompt"]) == (
        str(out / "openrlhf" / "eval_prompts.jsonl"), 2, 4)  # held-out validation through OpenRLHF's own
    assert lines[0].startswith("placement (openrlhf): 1 GPU(s)") and "vllm:0" in res.stdout
    plan = json.loads((out / "placement.json").read_text())
    assert plan["fits"] and [g["index"] for g in plan["gpus"]] == [0] and plan["gpus"][0]["memory_gb"] == 80
    assert {c["who"] for c in plan["gpus"][0]["claims"]} >= {"vllm:0", "actor:0", "ref:0"}
    rows = (out / "openrlhf" / "prompts.jsonl").read_text().splitlines()
    assert len(rows) == 3 * cfg.grpo.batch_states and f"{out / 'openrlhf' / 'prompts.jsonl'}: 6 rows" in res.stdout
    assert len((out / "openrlhf" / "eval_prompts.jsonl").read_text().splitlines()) == 5
    assert "SmolLM2's tokenizer as an estimate" not in res.stdout  # tiny-random:qwen2 is on this machine
    args = ["--config", "configs/paper-3b.yaml", "--dry-run", "-o", f"run.output_dir={tmp_path / 'p3'}", "-o",
            "grpo.steps=1", "--gpus", "2x80", "--policy", "Qwen/Qwen2.5-3B-Instruct"]
    res = subprocess.run([sys.executable, "-m", "escrag", "grpo", *args], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert "--actor.model_name_or_path Qwen/Qwen2.5-3B-Instruct " in res.stdout.splitlines()[-1]
    assert "SmolLM2's tokenizer as an estimate" in res.stdout and ": 128 rows" in res.stdout


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
    """The prompt file holds the batches the local backend would draw: ``grpo.steps`` of them, or the
    ``grpo.epochs`` passes rounded up to a whole batch, an epoch's remainder completed from the next."""
    from collections import Counter

    from trainer.sampler import StateSampler

    states = list(range(10))
    cfg = _cfg("gpu-smoke", "grpo.steps=3", "grpo.batch_states=4")
    sampler = StateSampler(10, 4, cfg.run.seed)
    assert orl.dataset_states(cfg, states) == [i for _ in range(3) for i in sampler.next_batch()]
    cfg = _cfg("gpu-smoke", "grpo.batch_states=4", "grpo.epochs=2", "grpo.steps=null")
    rows = orl.dataset_states(cfg, states)
    assert len(rows) == 20 and sorted(Counter(rows).values()) == [2] * 10  # 2 x 10 = 5 whole batches
    rows = orl.dataset_states(_cfg("gpu-smoke", "grpo.batch_states=4", "grpo.epochs=3", "grpo.steps=null"), states)
    assert len(rows) == 32 and set(Counter(rows).values()) == {3, 4}  # 30 -> 8 batches: none dropped


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


def _submit_commands():
    """Every ``ray job submit`` command written in the README and docs: continuation lines joined, and so
    are the lines of a quoted argument that spans several (a runtime-env JSON)."""
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        lines, cmd = doc.read_text(encoding="utf-8").splitlines(), None
        for line in lines:
            if cmd is None and "ray job submit" in line:
                cmd = line[line.index("ray job submit"):]
            elif cmd is not None:
                cmd += " " + line.strip()
            if cmd is not None and not cmd.endswith("\\") and cmd.count("'") % 2 == 0:
                if " -- " in cmd.replace("\\", " "):
                    yield doc.name, " ".join(cmd.replace("\\", " ").split())
                cmd = None


def test_documented_submits_ask_the_entrypoint_for_no_gpu():
    """Issue 24, finding 1: a GPU held by the job's driver leaves OpenRLHF's placement group (which
    asks for every GPU of the preset) waiting forever. Only a driver-only ``--until sft`` job may
    take one."""
    commands = list(_submit_commands())
    assert {doc for doc, _ in commands} >= {"cluster.md", "training.md", "reward.md"}, commands
    for doc, cmd in commands:
        head, entry = cmd.split(" -- ", 1)
        gpus = re.search(r"--entrypoint-num-gpus[ =]([0-9.]+)", head)
        if gpus and float(gpus.group(1)) > 0:
            assert "--until sft" in entry, f"{doc}: {cmd}"
