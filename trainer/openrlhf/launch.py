"""The OpenRLHF backend's launcher: our config -> ``openrlhf.cli.train_ppo_ray`` arguments, the prompt
dataset it reads, the check of every emitted flag against the pinned parser, and the run.

Owns: ``build_argv`` / ``command`` / ``one_line`` (config -> argv, vLLM's memory share from the
placement plan, ``trainer.placement``, which must fit), ``dataset_states`` (the prompt file holds whole
rollout batches: every step's, as the local sampler draws them), ``write_prompts`` (one JSONL row per
state, train and held-out validation: the rendered stage-1 prompt and the label the agent reads), ``parser_from_source``
and ``check_argv`` (the pinned ``train_ppo_ray.py`` read with ``ast``: its parser is built inline under
``__main__`` in a module that imports ray and vllm at the top, so it is never imported), and ``run``.

How our numbers map (docs/cluster.md has the table): group-normalised advantages (``group_norm``),
``rollout.group_size`` samples per prompt, KL to the reference in the loss with the k3 estimator
(``grpo.kl_coef``), per-token clipped ratio (``ppo``) with ``grpo.loss_agg``, ``grpo.batch_states``
prompts per rollout and one optimizer step per pass over them (``train.batch_size`` = states x
samples), the prompt file holding every step's batch (``grpo.epochs`` passes over the states, or
``grpo.steps`` batches) read as one episode, constant lr, AdamW betas (0.9, 0.999) like the local
learner. The agent (``trainer/openrlhf/agent.py``) applies top-k, the stop string and the per-stage
token caps, since OpenRLHF's sampling flags have none of them.

Departures from the local backend (by design, named in docs/cluster.md and tests/test_openrlhf_objective.py):
OpenRLHF normalises a group by its sample std (N-1) + 1e-9, ours by the population std with eps inside
the root; it always recomputes π_old with the DeepSpeed actor (ours with grpo.recompute_old_logprobs); it
keeps zero-advantage groups in the batch (their KL term and tokens count); it clamps the k3 KL to
[-10, 10] and the log-ratio to [-20, 20]. ``grpo.ratio_level: sequence`` has no OpenRLHF equivalent
(its ``gspo`` is the length-normalised geometric mean) and is refused.
"""

from __future__ import annotations

import argparse
import ast
import importlib.metadata
import importlib.util
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

from escrag.config import Config, ConfigError, output_path
from escrag.errors import UserError
from trainer.openrlhf.ranks import check_rank_split
from trainer.placement import engines, gpu_dtype, plan_for

OPENRLHF_VERSION = "0.11.2"  # the `cluster` extra pins the same version (a test checks)
ENTRY = "openrlhf.cli.train_ppo_ray"
INPUT_KEY, LABEL_KEY = "prompt", "label"  # the prompt dataset's fields (--data.input_key / label_key)
UNSET_URL = "unset: the run writes the URL of the server it starts"  # labels of a --dry-run's prompt file
_DTYPES = {"bfloat16": "bf16", "float16": "fp16"}
_LOSS_AGG = {"token_mean": "token-mean", "seq_mean": "seq-mean-token-mean"}


# ------------------------------------------------------------------------------ paths


def _abs(cfg: Config, *parts: str) -> Path:
    """An absolute path under ``run.output_dir``: OpenRLHF's actors do not share the launcher's cwd
    (on several nodes the output folder must be on storage they all mount)."""
    return output_path(cfg, *parts).resolve()


def default_policy(cfg: Config) -> Path:
    """The pipeline's SFT model: where training starts unless the caller names another policy."""
    return _abs(cfg, "sft")


def require_policy(cfg: Config, policy: str) -> None:
    """The default policy is the pipeline's SFT folder: say how to make it when it is missing."""
    if policy == str(default_policy(cfg)) and not Path(policy).is_dir():
        raise UserError(f"{policy}: no SFT model yet; run the pipeline (or `escrag sft`) first, or pass "
                        "--policy MODEL")


def prompts_path(cfg: Config) -> Path:
    return _abs(cfg, "openrlhf", "prompts.jsonl")


def eval_prompts_path(cfg: Config) -> Path:
    """The held-out states OpenRLHF validates on (``--eval.dataset``; ``grpo.eval_every``)."""
    return _abs(cfg, "openrlhf", "eval_prompts.jsonl")


def agent_path() -> str:
    """Absolute path of the agent module OpenRLHF loads by file (found without importing it)."""
    return str(Path(importlib.util.find_spec("trainer.openrlhf.agent").origin).resolve())


# ------------------------------------------------------------------------------ config -> argv


def check_config(cfg: Config) -> None:
    """Refuse settings OpenRLHF cannot express, naming the key."""
    o, g = cfg.openrlhf, cfg.grpo
    if gpu_dtype(cfg.policy.dtype) not in _DTYPES:
        raise ConfigError(f"policy.dtype: OpenRLHF trains in bfloat16 or float16, got {cfg.policy.dtype!r}")
    if g.ratio_level != "token":
        raise ConfigError("grpo.ratio_level: OpenRLHF has per-token ratios only (its gspo is the length-"
                          "normalised geometric mean, not eq. 10's sequence ratio); use 'token'")
    gpus = o.nodes * o.gpus_per_node
    if o.colocate and engines(cfg) * o.vllm_tensor_parallel != gpus:
        raise ConfigError(f"openrlhf.vllm_engines: colocated, engines x tensor parallel must equal the "
                          f"{gpus} actor GPUs, got {engines(cfg)} x {o.vllm_tensor_parallel}")
    check_rank_split(cfg)  # the pipeline checks it before its first stage; --backend may choose it later


def _placement(cfg: Config, vllm_gpu_memory: float) -> list[str]:
    """Actor, reference and engine GPUs; vLLM's memory share as the placement plan leaves it."""
    o = cfg.openrlhf
    nodes, gpus = str(o.nodes), str(o.gpus_per_node)
    argv = ["--actor.num_nodes", nodes, "--actor.num_gpus_per_node", gpus,
            "--vllm.num_engines", str(engines(cfg)), "--vllm.tensor_parallel_size", str(o.vllm_tensor_parallel),
            "--vllm.gpu_memory_utilization", str(vllm_gpu_memory)]
    if cfg.grpo.kl_coef > 0:  # the reference model exists only with a KL term
        argv += ["--ref.num_nodes", nodes, "--ref.num_gpus_per_node", gpus]
    if o.colocate:
        argv += ["--train.colocate_all", "--vllm.enable_sleep", "--ds.enable_sleep"]
    if o.prefix_caching:
        argv.append("--vllm.enable_prefix_caching")
    return argv


def _algorithm(cfg: Config) -> list[str]:
    g, ro = cfg.grpo, cfg.rollout
    argv = ["--algo.advantage.estimator", "group_norm", "--rollout.n_samples_per_prompt", str(ro.group_size),
            "--actor.policy_loss_type", "ppo", "--actor.eps_clip", str(g.clip_eps),
            "--actor.loss_agg_mode", _LOSS_AGG[g.loss_agg],
            "--rollout.batch_size", str(g.batch_states), "--train.batch_size", str(g.batch_states * ro.group_size),
            "--train.max_epochs", str(g.updates_per_batch),
            "--train.num_episodes", "1",  # the prompt file holds every step's batch (dataset_states)
            "--rollout.temperature", str(ro.temperature), "--rollout.top_p", str(ro.top_p),
            "--actor.adam.lr", str(g.lr), "--actor.adam.betas", "0.9", "0.999", "--actor.adam.weight_decay", "0",
            "--actor.lr_scheduler", "constant", "--actor.lr_warmup_ratio", "0",
            "--actor.max_norm", str(g.max_grad_norm), "--algo.kl.init_coef", str(g.kl_coef)]
    if g.kl_coef > 0:
        argv += ["--algo.kl.use_loss", "--algo.kl.estimator", "k3"]
    return argv


def _deepspeed(cfg: Config) -> list[str]:
    o, lora = cfg.openrlhf, cfg.policy.lora
    argv = ["--ds.zero_stage", str(o.zero_stage), "--ds.param_dtype", _DTYPES[gpu_dtype(cfg.policy.dtype)],
            "--ds.grad_accum_dtype", o.grad_accum_dtype,  # DeepSpeed's data_types; fp32 like the local learner
            "--ds.attn_implementation", o.attn_implementation,
            "--train.micro_batch_size", str(cfg.grpo.micro_batch_size),
            "--rollout.micro_batch_size", str(o.rollout_micro_batch_size)]
    if cfg.policy.gradient_checkpointing:
        argv.append("--actor.gradient_checkpointing_enable")
    if o.adam_offload:
        argv.append("--ds.adam_offload")
    if lora.enabled:
        argv += ["--ds.lora.rank", str(lora.r), "--ds.lora.alpha", str(lora.alpha),
                 "--ds.lora.dropout", str(lora.dropout), "--ds.lora.target_modules", *lora.target_modules]
    return argv


def _io(cfg: Config, policy: Path | str, resume: bool) -> list[str]:
    g = cfg.grpo
    argv = ["--actor.model_name_or_path", str(policy), "--train.agent_func_path", agent_path(),
            "--data.prompt_dataset", str(prompts_path(cfg)), "--data.input_key", INPUT_KEY,
            "--data.label_key", LABEL_KEY, "--data.max_len", str(cfg.openrlhf.max_len),
            "--train.seed", str(cfg.run.seed),  # DeepSpeed's and vLLM's seeds; not the prompt order (dataset_states)
            "--ckpt.output_dir", str(_abs(cfg, "policy")),
            "--ckpt.path", str(_abs(cfg, "checkpoints", "openrlhf")),
            "--ckpt.save_steps", str(g.checkpoint_every), "--ckpt.max_num", str(g.keep_checkpoints),
            # no best_global_stepN: with --eval.* and the default "" OpenRLHF saves a full DeepSpeed
            # checkpoint each time eval_*_pass1 improves, outside --ckpt.max_num (ppo_trainer.py)
            "--ckpt.best_metric_key", "none",
            "--logger.logging_steps", str(g.log_every)]
    if g.tensorboard:
        argv += ["--logger.tensorboard_dir", str(_abs(cfg, "tensorboard"))]
    if g.eval_every:  # OpenRLHF's validation: mean and best reward of the samples (no format or risk split)
        argv += ["--eval.dataset", str(eval_prompts_path(cfg)), "--eval.steps", str(g.eval_every),
                 "--eval.temperature", str(cfg.rollout.temperature),
                 "--eval.n_samples_per_prompt", str(cfg.rollout.group_size)]
    if resume:
        argv.append("--ckpt.load_enable")  # resumes from the newest checkpoint under --ckpt.path
    return argv


def build_argv(cfg: Config, policy: Path | str | None = None, resume: bool = False) -> list[str]:
    """Every ``train_ppo_ray`` flag for ``cfg`` (policy: the SFT model by default). Fails, naming the
    consumer and the numbers, when the placement plan (``trainer.placement``) does not fit."""
    check_config(cfg)
    vllm_gpu_memory = plan_for(cfg).require().vllm_gpu_memory
    policy = policy or default_policy(cfg)
    if Path(policy).exists():  # a local folder; anything else is a hub name OpenRLHF resolves itself
        policy = Path(policy).resolve()
    return [*_io(cfg, policy, resume), *_placement(cfg, vllm_gpu_memory), *_algorithm(cfg), *_deepspeed(cfg)]


def command(cfg: Config, policy: Path | str | None = None, resume: bool = False,
            python: str = sys.executable) -> list[str]:
    return [python, "-m", ENTRY, *build_argv(cfg, policy, resume)]


def run_env(cfg: Config) -> dict[str, str]:
    """Environment of the run: join ``ray.address`` when the config names one."""
    return {"RAY_ADDRESS": cfg.ray.address} if cfg.ray.address else {}


def one_line(cmd: list[str], env: dict[str, str] | None = None) -> str:
    """The command as one shell line, with its environment assignments first."""
    prefix = [f"{k}={shlex.quote(v)}" for k, v in (env or {}).items()]
    return " ".join([*prefix, shlex.join(cmd)])


# ------------------------------------------------------------------------------ the prompt dataset


def sampler_scheme(cfg: Config, resume: bool) -> int:
    """The state sampler's seeding scheme for the prompt file (``trainer.sampler``): a fresh run's, or
    on resume the one the existing file was drawn with (recorded beside it; a file written before the
    record existed used scheme 1). OpenRLHF resumes by position in the file, so the order must stay."""
    from trainer.sampler import SCHEME

    meta, prompts = prompts_path(cfg).with_suffix(".meta.json"), prompts_path(cfg)
    if not resume or not prompts.is_file():
        return SCHEME
    return int(json.loads(meta.read_text())["sampler_scheme"]) if meta.is_file() else 1


def dataset_states(cfg: Config, states: list, scheme: int | None = None) -> list:
    """The rows' states: the batches of every step of the run (``trainer.sampler.total_steps``), drawn
    as the local backend draws them (with ``scheme``, default a fresh sampler's), so the file holds a
    whole number of rollout batches and OpenRLHF, which keeps a short last batch, never makes one. No
    state is dropped: an epoch's remainder opens a batch that the next epoch's permutation completes,
    so with ``grpo.epochs`` E every state is in the file E or E + 1 times; OpenRLHF reads it as one
    episode and shuffles its rows itself: ``prepare_datasets`` (openrlhf/trainer/ppo_trainer.py) builds
    the prompt loader with shuffle=True, which no flag turns off, in the ``PPOTrainer`` controller, where
    no distributed sampler is set up and ``--train.seed`` seeds nothing (the model actors' setup_distributed
    does), so its batches are an unseeded permutation of the file's rows: the same rows each pass, not the
    local sampler's batches and not the same order twice (resume keeps it: the loader's state is in the
    checkpoint). docs/cluster.md names the difference."""
    from trainer.sampler import StateSampler, total_steps

    sampler = StateSampler(len(states), cfg.grpo.batch_states, cfg.run.seed)
    sampler.scheme = sampler.scheme if scheme is None else scheme
    return [states[i] for _ in range(total_steps(cfg.grpo, len(states))) for i in sampler.next_batch()]


def _rows(cfg: Config, states: list, tokenizer, retriever_url: str | None, reward_url: str) -> list[str]:
    """One JSONL row per state; fails when a stage-1 prompt leaves no room for both stages."""
    from escrag.progress import progress_bar
    from trainer.openrlhf.agent import episode_label, stage1_prompt

    rows, longest = [], 0
    for state in progress_bar(states, desc="prompt dataset", unit="state", file=sys.stderr):
        text = stage1_prompt(tokenizer, state.history, cfg)
        longest = max(longest, len(tokenizer(text, add_special_tokens=False).input_ids))
        rows.append(json.dumps({INPUT_KEY: text, LABEL_KEY: episode_label(state, cfg, retriever_url, reward_url)}))
    ro = cfg.rollout
    need = longest + ro.max_new_tokens_stage1 + (ro.max_new_tokens_stage2 if ro.rag else 0)
    if need > cfg.openrlhf.max_len:
        raise ConfigError(f"openrlhf.max_len: the longest stage-1 prompt ({longest} tokens) plus the stage "
                          f"token caps need {need} > {cfg.openrlhf.max_len}, before the exemplars; raise it "
                          "or set data.max_history_turns")
    return rows


def write_prompts(cfg: Config, states: list, tokenizer, retriever_url: str | None, reward_url: str,
                  resume: bool = False, eval_states: list = ()) -> list[tuple[Path, int]]:
    """The prompt dataset (``dataset_states`` of the train ``states``) and, with ``eval_states``, the
    validation set (``eval_prompts_path``), each row ``{"prompt": stage-1 prompt text, "label": the
    agent's JSON label}``, written atomically (rewritten on resume too: the services' URLs may have
    changed, the order may not). Returns [(path, rows)]."""
    from escrag.atomic import write_text

    scheme = sampler_scheme(cfg, resume)
    out = []
    for path, chosen in ((prompts_path(cfg), dataset_states(cfg, states, scheme)),
                         (eval_prompts_path(cfg), list(eval_states))):
        if chosen:
            write_text(path, "\n".join(_rows(cfg, chosen, tokenizer, retriever_url, reward_url)) + "\n")
            out.append((path, len(chosen)))
    write_text(prompts_path(cfg).with_suffix(".meta.json"), json.dumps({"sampler_scheme": scheme}) + "\n")
    return out


# ------------------------------------------------------------------------------ the flag check


class _StrictParser(argparse.ArgumentParser):
    def error(self, message):
        raise UserError(f"{ENTRY}: {message}")


def openrlhf_source() -> Path:
    """``openrlhf/cli/train_ppo_ray.py`` of the installed, pinned OpenRLHF (never imported)."""
    spec = importlib.util.find_spec("openrlhf")
    if spec is None or not spec.submodule_search_locations:
        raise UserError("OpenRLHF is not installed: `pip install -e '.[cluster]'` on a GPU machine "
                        "(`make install` adds a no-deps copy for the CPU tests)")
    version = importlib.metadata.version("openrlhf")
    if version != OPENRLHF_VERSION:
        raise UserError(f"openrlhf {version} is installed; this launcher is written for {OPENRLHF_VERSION}")
    return Path(list(spec.submodule_search_locations)[0], "cli", "train_ppo_ray.py")


def _value(node, env: dict):
    """A literal, a loop variable, or an f-string over loop variables; ValueError otherwise."""
    if isinstance(node, ast.Name) and node.id in env:
        return env[node.id]
    if isinstance(node, ast.JoinedStr):
        parts = [v.value if isinstance(v, ast.Constant) else _value(v.value, env) for v in node.values]
        return "".join(str(p) for p in parts)
    return ast.literal_eval(node)


def _add_argument_calls(stmts: list, env: dict):
    """(call, loop bindings) of every ``*.add_argument(...)``; ``for x in (literals)`` loops unrolled."""
    for st in stmts:
        if isinstance(st, ast.For) and isinstance(st.target, ast.Name):
            for v in ast.literal_eval(st.iter):
                yield from _add_argument_calls(st.body, {**env, st.target.id: v})
            continue
        blocks = [getattr(st, f) for f in ("body", "orelse", "finalbody") if isinstance(getattr(st, f, None), list)]
        blocks += [h.body for h in getattr(st, "handlers", [])]
        if blocks:
            for block in blocks:
                yield from _add_argument_calls(block, env)
            continue
        for node in ast.walk(st):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
                yield node, env


_KEEP = {"action", "choices", "nargs", "dest", "type"}
_TYPES = {"int": int, "float": float, "str": str}


def parser_from_source(path: Path | None = None) -> argparse.ArgumentParser:
    """An argparse parser with exactly the options (names, actions, types, nargs, choices) that the
    pinned ``train_ppo_ray.py`` declares; no abbreviations, errors raise ``UserError``."""
    tree = ast.parse(Path(path or openrlhf_source()).read_text())
    parser = _StrictParser(prog=ENTRY, add_help=False, allow_abbrev=False, exit_on_error=False)
    for call, env in _add_argument_calls(tree.body, {}):
        names = [_value(a, env) for a in call.args]
        kwargs = {}
        for kw in call.keywords:
            if kw.arg == "type":
                kwargs["type"] = _TYPES[kw.value.id]
            elif kw.arg in _KEEP:
                kwargs[kw.arg] = _value(kw.value, env)
        parser.add_argument(*names, **kwargs)
    return parser


def check_argv(argv: list[str], parser: argparse.ArgumentParser | None = None) -> dict:
    """Parse ``argv`` as the pinned parser would; returns dest -> value. Raises ``UserError`` naming
    every flag it does not declare, or a value outside its ``choices`` or of the wrong type."""
    parser = parser or parser_from_source()
    try:
        ns, unknown = parser.parse_known_args(argv)
    except argparse.ArgumentError as exc:
        raise UserError(f"{ENTRY}: {exc}") from None
    if unknown:
        raise UserError(f"{ENTRY} {OPENRLHF_VERSION} does not accept: {' '.join(unknown)}")
    return vars(ns)


# ------------------------------------------------------------------------------ the run


def run(cmd: list[str], env: dict[str, str], log=print) -> int:
    """Check the flags against the installed parser, then run OpenRLHF; returns its exit code."""
    check_argv(cmd[3:])
    log(f"[openrlhf] {one_line(cmd, env)}")
    return subprocess.run(cmd, env={**os.environ, **env}).returncode


def prompt_tokenizer(cfg: Config, policy: str, given: str | None, log=print):
    """The tokenizer ``--dry-run`` renders the prompt file with: ``--tokenizer``; else the policy's when
    it is on this machine (the SFT folder, or ``policy.model`` as a folder or packaged model); else
    SmolLM2's as an estimate (another chat template and token count than Qwen's: the run itself
    rewrites the file with the policy's tokenizer). Hub names are never looked up."""
    from escrag.models import load_tokenizer

    if given:
        return load_tokenizer(given)
    for spec in (policy, cfg.policy.model):
        if Path(spec).is_dir() or spec.startswith(("packaged:", "tiny-random:")):
            return load_tokenizer(spec)
    log(f"[dry-run] {policy} and {cfg.policy.model} are not on this machine: the prompt file is rendered with "
        "SmolLM2's tokenizer as an estimate (--tokenizer SPEC to choose; the run rewrites it with the policy's)")
    return load_tokenizer("packaged:smollm2-135m-instruct")
