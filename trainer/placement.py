"""The placement plan: config + the GPUs -> where every GPU consumer sits and how much memory it needs.

Owns: ``make_plan(cfg, gpus)`` (pure: the config, ``(count, GiB each)``, and the models' shapes from
``escrag.shapes``), the memory estimates it adds up (below), ``Plan`` (its table, its
``placement.json``, ``require`` which stops a plan that does not fit before anything starts, and the
GPU each service is pinned to), and ``job_gpus`` (the GPUs a run plans for: ``placement.gpus``, else
Ray's count and torch's memory). Used by ``--dry-run``, the OpenRLHF launcher (it emits the lowered
``--vllm.gpu_memory_utilization``) and the local job (it pins the services with
``CUDA_VISIBLE_DEVICES``). GiB throughout.

Consumers. OpenRLHF (``grpo.backend: openrlhf``), per actor GPU i, colocated (``--ds.enable_sleep``,
``--vllm.enable_sleep``): ``actor:i`` in both phases (its bf16 shards: ``offload_deepspeed_states`` in
openrlhf/utils/deepspeed/deepspeed_utils.py leaves lp_params on the GPU), ``actor:i train`` (the rest),
``ref:i`` in both phases (ReferenceModelActor, openrlhf/trainer/ray/launcher.py, never sleeps: the
trainer's ``_run_sleep`` touches actor and critic only), ``vllm:i`` (rollout) and ``vllm:i asleep``
(train: context + ``placement.vllm_graphs_gb`` of CUDA graphs, which level-1 sleep keeps; OpenRLHF never
sets enforce_eager); not colocated, actor, reference and engines get GPUs of their own. Local backend:
``learner`` (policy + reference in one process) and ``worker:w`` where the Ray shares of
``trainer.learner.place`` put them (first fit, as Ray packs fractions), all resident at once. Both:
``reward`` (the reward server's backbone) and ``embedder`` (the retriever's), each placed on the GPU
with the most room; local only, ``safety:w`` (a worker's crisis-check backbone when
``safety.conv_device`` is not cpu) on its worker's GPU. A GPU fits when its resident claims plus its
larger phase fit ``placement.usable_fraction`` of its memory (0.99: 79.2 GiB of an "80 GB" card, as torch
reports it). Host RAM (OpenRLHF, one node): what DeepSpeed's sleep or ``adam_offload`` pins there and
each engine's level-1 sleep copy of its weights, against ``placement.host_memory_gb``. (The paper gives
only the GPU counts: 2 and 4 A800s.)

Estimates (P parameters, L layers, h hidden, I MLP width, k = kv_heads x head_dim, V vocabulary,
T tokens of a micro-batch, b bytes of the compute dtype, R ranks; ``tests/gpu/device_check.py``
measures the local learner's; docs/cluster.md names each source):
- weights: P x bytes(dtype);
- training state of a full fine-tune with Adam: local learner 16P (float32 weights, gradients, two
  moments) + 2P of bfloat16 weight copies under autocast; DeepSpeed 2P bf16 params (/R at ZeRO 3) + gP
  gradients in ``openrlhf.grad_accum_dtype`` (g = 4 for fp32, /R from ZeRO 2; DeepSpeed 0.19.6
  stage3.py's grad_partitions_flat_buffer) + 12P fp32 master and moments (/R from ZeRO 1; on the CPU
  with ``openrlhf.adam_offload``): 18P/R at ZeRO 3 in fp32. Plus DeepSpeed's buffers at the defaults
  OpenRLHF leaves ("auto" is dropped: deepspeed/runtime/config_utils.py; deepspeed/runtime/zero/config.py):
  2(max(1e9, the largest module) + 5e7) bytes of gathered parameters at ZeRO 3, a 5e8-element bf16
  gradient bucket; and the step's fp32 copy of one sub-group's gradient, 4 min(P/R, 1e9) bytes
  (stage3.py ``_prepare_fp32_grad_for_sub_group``; FusedAdam steps in place). LoRA: the frozen weights
  and 16 bytes per adapter parameter;
- activations of a training micro-batch: one layer keeps T(18h + 6k + 8I) b/2 bytes (norm inputs in
  float32, q/k/v/attention output, four MLP tensors of width I; flash/SDPA attention keeps no T x T);
  all L layers without checkpointing, with it each layer's input (T h x the residual's bytes: 2 under
  DeepSpeed, 4 over float32 master weights) plus one layer being recomputed; and the logits of the
  scored positions, (b + 8) bytes each (the logits, their float32 copy, its gradient);
- a forward without gradients (reference, reward backbone, embedder, experience making): one layer's
  T(2h + 3I) b plus, for log-probs, (b + 4) bytes per logit;
- KV cache: 2 L k b per token; a vLLM engine claims ``rollout.vllm_gpu_memory`` of its GPU's usable
  memory (its CUDA graphs inside: vLLM profiles them into the share since 0.21), lowered to what the
  resident services leave, and must hold its weights and one ``openrlhf.max_len`` sequence; asleep it
  keeps its context and ``placement.vllm_graphs_gb`` (vLLM logs 1.62 GiB of graphs for a dense Qwen at
  the default capture sizes: vllm-project/vllm#39559);
- host: (g + 12)P/R + the bucket per sleeping rank (adam_offload: (12 + g)P/R for the whole run) and
  2P per colocated engine (vLLM level-1 sleep backs the bf16 weights up in CPU memory).
Worst cases: every micro-batch padded to ``openrlhf.max_len`` (OpenRLHF) or ``rollout.max_seq_len``
(local), every reward batch ``reward.max_batch`` x ``reward.max_length`` tokens; the step's temporary on
top of the larger of the training micro-batch and the experience forward.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from escrag.config import Config, ConfigError
from escrag.shapes import Shape, shape_of

GIB = 2**30
BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
PHASES = ("rollout", "train")  # besides "always": colocated OpenRLHF alternates them
VLLM = "vLLM engine"  # what a vLLM claim says: its size is set last (_fit_vllm), from what is left
ACCUM_BYTES = {"fp32": 4, "bf16": 2}  # openrlhf.grad_accum_dtype -> bytes of a gradient
# DeepSpeed 0.19.6's ZeRO defaults (deepspeed/runtime/zero/config.py). They hold under OpenRLHF because its
# get_train_ds_config / get_eval_ds_config (openrlhf/utils/deepspeed/deepspeed_utils.py) set these keys to
# "auto" and DeepSpeedConfigModel drops "auto" values outside the HF Trainer (deepspeed/runtime/config_utils.py).
DS_MAX_LIVE = 10**9  # stage3_max_live_parameters: gathered parameters a rank keeps at once
DS_PREFETCH = 5 * 10**7  # stage3_prefetch_bucket_size
DS_REDUCE_BUCKET = 5 * 10**8  # reduce_bucket_size: the contiguous gradient (ipg) bucket, in the param dtype
DS_SUB_GROUP = 10**9  # sub_group_size: the step converts one sub-group's gradient to fp32 at a time


# ------------------------------------------------------------------------------ estimates (GiB)


def gpu_dtype(dtype: str) -> str:
    """A dtype as it is on a GPU, for which every plan is made: ``auto`` is bfloat16 there."""
    return "bfloat16" if dtype == "auto" else dtype


def weights_gb(s: Shape, dtype: str) -> float:
    return s.params * BYTES[dtype] / GIB


def layer_params(s: Shape) -> int:
    return (s.params - s.vocab * s.hidden * (1 if s.tied else 2)) // s.layers


def zero_state_gb(s: Shape, stage: int, ranks: int, adam_offload: bool, grad_bytes: int = 2) -> float:
    """DeepSpeed mixed-precision Adam state on one rank's GPU: bf16 params (2P, split at ZeRO 3), the
    gradients in the accumulation dtype (``grad_bytes`` P, split from ZeRO 2), fp32 master weights and two
    moments (12P, split from ZeRO 1; on the CPU with ``adam_offload``, the gradients with them). ZeRO-3
    with fp32 accumulation: 18P/R."""
    p, master, grads = s.params, 0 if adam_offload else 12, 0 if adam_offload else grad_bytes
    split = ranks if stage >= 1 else 1
    return p * (2 / (ranks if stage == 3 else 1) + grads / (ranks if stage >= 2 else 1) + master / split) / GIB


def zero_buffers_gb(s: Shape, stage: int) -> tuple[float, float]:
    """(gathered parameters, gradient bucket) in GiB a DeepSpeed rank adds to its state, at the ZeRO
    defaults OpenRLHF leaves (DS_*): ZeRO-3 holds up to ``stage3_max_live_parameters`` gathered bf16
    parameters (at least the largest module) plus a prefetch bucket; every stage keeps a contiguous
    ``reduce_bucket_size`` gradient bucket in the param dtype."""
    largest = max(s.vocab * s.hidden, s.hidden * s.intermediate)
    live = 2 * (max(DS_MAX_LIVE, largest) + DS_PREFETCH) / GIB if stage == 3 else 0.0
    return live, 2 * DS_REDUCE_BUCKET / GIB


def zero_step_gb(s: Shape, stage: int, ranks: int, adam_offload: bool) -> float:
    """The optimizer step's temporary: DeepSpeed flattens each sub-group's gradient to fp32 before
    FusedAdam steps it in place (``_prepare_fp32_grad_for_sub_group``, deepspeed/runtime/zero/stage3.py):
    4 bytes per parameter of the rank's share, at most ``sub_group_size`` of them; none when the step
    runs on the CPU (``adam_offload``)."""
    if adam_offload:
        return 0.0
    share = s.params / (ranks if stage >= 1 else 1)
    return 4 * min(share, DS_SUB_GROUP) / GIB


def train_acts_gb(s: Shape, tokens: int, checkpointing: bool, b: int, residual: int, logit_tokens: int) -> float:
    layer = tokens * (18 * s.hidden + 6 * s.kv_dim + 8 * s.intermediate) * b / 2
    kept = s.layers * tokens * s.hidden * residual + layer if checkpointing else s.layers * layer
    return (kept + logit_tokens * s.vocab * (b + 8)) / GIB


def forward_gb(s: Shape, tokens: int, b: int, logits: bool = False) -> float:
    return (tokens * (2 * s.hidden + 3 * s.intermediate) * b + (tokens * s.vocab * (b + 4) if logits else 0)) / GIB


def kv_gb(s: Shape, tokens: int, b: int) -> float:
    return 2 * s.layers * s.kv_dim * b * tokens / GIB


# ------------------------------------------------------------------------------ the plan


@dataclass
class Claim:
    who: str  # "vllm:0", "actor:1", "reward", ...
    gb: float  # GiB
    phase: str = "always"  # "always", or "rollout" / "train" (colocated OpenRLHF sleeps the other)
    what: str = ""  # how the number is made up


@dataclass
class Gpu:
    index: int
    memory_gb: float  # as named (placement.gpus) or read from torch
    claims: list[Claim] = field(default_factory=list)
    usable_gb: float | None = None  # what a plan may fill: memory_gb x placement.usable_fraction

    @property
    def cap(self) -> float:
        return self.memory_gb if self.usable_gb is None else self.usable_gb

    def need(self, phase: str) -> float:
        return sum(c.gb for c in self.claims if c.phase in ("always", phase))

    @property
    def peak_gb(self) -> float:
        return max(self.need(p) for p in PHASES)


@dataclass
class Plan:
    backend: str
    gpus: list[Gpu]
    cpu: list[str] = field(default_factory=list)  # consumers that run on the CPU
    vllm_gpu_memory: float | None = None  # what the engines get (rollout.vllm_gpu_memory, maybe lowered)
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    host: list[Claim] = field(default_factory=list)  # RAM of one node (OpenRLHF: offloaded states, vLLM's backup)
    host_memory_gb: float | None = None  # placement.host_memory_gb

    @property
    def host_gb(self) -> float:
        return sum(c.gb for c in self.host)

    def device(self, who: str) -> int | None:
        """The GPU index ``who`` sits on, None on the CPU."""
        return next((g.index for g in self.gpus for c in g.claims if c.who == who), None)

    def to_json(self) -> dict:
        def claims(cs):
            return [{"who": c.who, "gb": round(c.gb, 1), "phase": c.phase, "what": c.what} for c in cs]

        gpus = [{"index": g.index, "memory_gb": g.memory_gb, "usable_gb": round(g.cap, 2),
                 "peak_gb": round(g.peak_gb, 1), **{f"{p}_gb": round(g.need(p), 1) for p in PHASES},
                 "claims": claims(g.claims)} for g in self.gpus]
        host = {"memory_gb": self.host_memory_gb, "need_gb": round(self.host_gb, 1), "per": "node",
                "claims": claims(self.host)}
        return {"backend": self.backend, "fits": not self.problems, "gpus": gpus, "host": host, "cpu": self.cpu,
                "vllm_gpu_memory": self.vllm_gpu_memory, "notes": self.notes, "problems": self.problems}

    def write(self, path: str | Path) -> Path:
        from escrag.atomic import write_text

        return write_text(Path(path), json.dumps(self.to_json(), indent=2) + "\n")

    def table(self) -> str:
        rows = [f"placement ({self.backend}): {len(self.gpus)} GPU(s)"
                + (f", vLLM gets {self.vllm_gpu_memory} of its GPU" if self.vllm_gpu_memory else "")]
        for g in self.gpus:
            rows.append(f"  GPU {g.index} ({g.memory_gb:g} GiB, {g.cap:g} usable): peak {g.peak_gb:.1f} GiB "
                        + ", ".join(f"{p} {g.need(p):.1f}" for p in PHASES))
            rows += [f"    {c.who:<15} {c.gb:6.1f} GiB  {c.phase:<7} {c.what}" for c in g.claims]
        if self.host:
            rows.append(f"  host RAM (per node): {self.host_gb:.1f} of {self.host_memory_gb:g} GiB "
                        "(placement.host_memory_gb)")
            rows += [f"    {c.who:<15} {c.gb:6.1f} GiB  {c.phase:<7} {c.what}" for c in self.host]
        rows += [f"  on the CPU: {', '.join(self.cpu)}"] if self.cpu else []
        rows += [f"  note: {n}" for n in self.notes] + [f"  DOES NOT FIT: {p}" for p in self.problems]
        return "\n".join(rows)

    def require(self) -> Plan:
        """The plan, or a ConfigError naming each consumer that does not fit and the numbers."""
        if self.problems:
            raise ConfigError("placement: the plan does not fit; " + "; ".join(self.problems)
                              + " (docs/cluster.md, memory; --dry-run prints the plan)")
        return self


def parse_gpus(text: str) -> tuple[int, float]:
    """``"2x80"`` -> (2, 80.0)."""
    count, gb = text.split("x")
    return int(count), float(gb)


def make_plan(cfg: Config, gpus: tuple[int, float]) -> Plan:
    """Where every GPU consumer of a training job sits on ``gpus`` = (count, GiB each), with its
    memory estimate; ``plan.problems`` says what does not fit (``Plan.require``)."""
    count, gb = gpus
    usable = round(gb * cfg.placement.usable_fraction, 4)
    plan = Plan(cfg.grpo.backend, [Gpu(i, gb, usable_gb=usable) for i in range(count)],
                host_memory_gb=cfg.placement.host_memory_gb)
    home = _openrlhf(cfg, plan) if cfg.grpo.backend == "openrlhf" else _local(cfg, plan)
    for who, device, claim in _services(cfg):
        _put_service(plan, who, device, claim, home)
    _fit_vllm(cfg, plan)
    for g in plan.gpus:
        for phase in PHASES:
            if g.need(phase) > g.cap + 1e-9:
                parts = " + ".join(f"{c.who} {c.gb:.1f}" for c in g.claims if c.phase in ("always", phase))
                plan.problems.append(f"GPU {g.index} ({g.memory_gb:g} GiB) needs {g.need(phase):.1f} GiB in the "
                                     f"{phase} phase, of {g.cap:g} usable: {parts}")
                break
    if plan.host and plan.host_gb > plan.host_memory_gb + 1e-9:
        parts = " + ".join(f"{c.who} {c.gb:.1f}" for c in plan.host)
        plan.problems.append(f"host RAM: a node needs {plan.host_gb:.1f} GiB, placement.host_memory_gb is "
                             f"{plan.host_memory_gb:g}: {parts}")
    return plan


def _policy_state(cfg: Config, s: Shape, zero: tuple[int, int, bool] | None) -> tuple[float, str]:
    """(GiB, how) of the policy's training state: DeepSpeed's with ``zero`` = (stage, ranks, adam
    offload), else the local learner's."""
    lora = cfg.policy.lora
    if lora.enabled:
        adapters = s.layers * sum(lora.r * sum(_dims(s)[m]) for m in lora.target_modules if m in _dims(s))
        shards = zero[1] if zero and zero[0] == 3 else 1
        base = weights_gb(s, gpu_dtype(cfg.policy.dtype) if zero else "float32") / shards
        return base + 16 * adapters / GIB, f"LoRA: frozen weights {base:.1f} + adapters"
    if zero:
        return zero_state_gb(s, *zero), f"ZeRO-{zero[0]} over {zero[1]} ranks"
    cast = 2 * s.params / GIB if gpu_dtype(cfg.policy.dtype) != "float32" else 0.0
    return 16 * s.params / GIB + cast, "fp32 weights+grads+Adam 16P" + (" + bf16 casts 2P" if cast else "")


def _dims(s: Shape) -> dict[str, tuple[int, int]]:
    """(in, out) of each linear a LoRA adapter can wrap."""
    h, k, i = s.hidden, s.kv_dim, s.intermediate
    return {"q_proj": (h, h), "k_proj": (h, k), "v_proj": (h, k), "o_proj": (h, h), "gate_proj": (h, i),
            "up_proj": (h, i), "down_proj": (i, h)}


def _train_acts(cfg: Config, s: Shape, seq: int, logit_len: int, residual: int) -> tuple[float, str]:
    """Activations of one training micro-batch of ``seq`` tokens a row, ``logit_len`` scored."""
    b, mb, ckpt = BYTES[gpu_dtype(cfg.policy.dtype)], cfg.grpo.micro_batch_size, cfg.policy.gradient_checkpointing
    gb = train_acts_gb(s, mb * seq, ckpt, b, residual, mb * logit_len)
    return gb, f"activations {mb}x{seq} tokens{' (checkpointed)' if ckpt else ''} {gb:.1f}"


def engines(cfg: Config) -> int:
    """OpenRLHF's vLLM engines: ``openrlhf.vllm_engines``, else one per actor GPU / tensor parallel."""
    o = cfg.openrlhf
    return o.vllm_engines or max(1, o.nodes * o.gpus_per_node // o.vllm_tensor_parallel)


def _openrlhf(cfg: Config, plan: Plan) -> list[int]:
    """OpenRLHF's actor, reference and vLLM claims, and the host RAM of one node; returns the GPUs the
    services may use (the head's). Colocated (``--ds.enable_sleep``, ``--vllm.enable_sleep``):
    ``actor:r`` keeps its bf16 shards in both phases (``offload_deepspeed_states``, openrlhf/utils/
    deepspeed/deepspeed_utils.py, moves optim_states, hp_params, lp_grads and the gradient bucket to the
    CPU and leaves lp_params; nothing with adam_offload), ``actor:r train`` is the rest; ``ref:r`` never
    sleeps (``ReferenceModelActor``, openrlhf/trainer/ray/launcher.py, has no offload_states and
    ``PPOTrainer.ppo_train``'s ``_run_sleep`` reloads and offloads only actor and critic); ``vllm:e
    asleep`` keeps its context and CUDA graphs."""
    o, pc, s = cfg.openrlhf, cfg.placement, shape_of(cfg.policy.model)
    ovh, dtype = pc.process_overhead_gb, gpu_dtype(cfg.policy.dtype)
    ranks, ref, tp = o.nodes * o.gpus_per_node, cfg.grpo.kl_coef > 0, o.vllm_tensor_parallel
    need = ranks if o.colocate else ranks * (1 + ref) + engines(cfg) * tp
    if len(plan.gpus) < need:
        plan.problems.append(f"placement.gpus: {len(plan.gpus)} GPUs, but the OpenRLHF layout needs {need} "
                             f"(openrlhf.nodes x gpus_per_node{'' if o.colocate else ' x 2 + engines x TP'})")
        return []
    b, z, g = BYTES[dtype], o.zero_stage, ACCUM_BYTES[o.grad_accum_dtype]
    shards = ranks if z == 3 else 1
    lp = weights_gb(s, dtype) / shards  # the rank's bf16 parameters
    live, bucket = zero_buffers_gb(s, z)
    if cfg.policy.lora.enabled:
        state, how = _policy_state(cfg, s, (z, ranks, o.adam_offload))
        kept, step = lp, 0.0
    else:
        state, step = zero_state_gb(s, z, ranks, o.adam_offload, g), zero_step_gb(s, z, ranks, o.adam_offload)
        how = (f"ZeRO-{z} over {ranks} ranks: bf16 params 2P{'/R' if z == 3 else ''}, "
               + ("master, moments and grads on the CPU (adam_offload)" if o.adam_offload else
                  f"{o.grad_accum_dtype} grads {g}P{'/R' if z >= 2 else ''}, fp32 master + moments 12P"
                  f"{'/R' if z >= 1 else ''}") + f" {state:.1f}")
        kept = lp + (bucket if o.adam_offload else 0.0)  # offload_deepspeed_states returns early with adam_offload
    train, acts = _train_acts(cfg, s, o.max_len, o.max_len, residual=b)
    fwd = forward_gb(s, o.rollout_micro_batch_size * o.max_len, b, logits=True)
    rest = state + live + bucket + step + max(train, fwd)
    rest_what = (f"{how} + gathered params {live:.1f} and gradient bucket {bucket:.1f} (DeepSpeed defaults: "
                 f"stage3_max_live_parameters 1e9, prefetch 5e7, reduce_bucket_size 5e8) + the step's fp32 "
                 f"gradient {step:.1f} (stage3.py, sub_group_size 1e9) + max({acts}, experience forward {fwd:.1f})")
    ref_gb = weights_gb(s, dtype) / shards
    ref_what = (f"{dtype} weights{' / ' + str(ranks) + ' (ZeRO-3)' if z == 3 else ''} + {ovh:g}: never asleep "
                "(ReferenceModelActor has no offload_states; _run_sleep sleeps actor and critic only); its "
                "forward runs while the actor's states are offloaded (experience making)")
    for r in range(ranks):
        actor_gpu, ref_gpu = (r, r) if o.colocate else (r, ranks + r)
        if o.colocate:
            plan.gpus[r].claims += [
                Claim(f"actor:{r}", kept + ovh, "always", f"bf16 shards {lp:.1f} kept asleep (deepspeed_utils.py "
                      f"offload_deepspeed_states leaves lp_params{'; adam_offload: nothing moves' if o.adam_offload else ''})"
                      f" + {ovh:g}"),
                Claim(f"actor:{r} train", rest - kept, "train", f"{rest_what}, less the kept {kept:.1f}")]
        else:
            plan.gpus[actor_gpu].claims.append(Claim(f"actor:{r}", rest + ovh, "always", f"{rest_what} + {ovh:g}"))
        if ref:
            extra = 0.0 if o.colocate else live + fwd  # on its own GPU its forward is its own
            plan.gpus[ref_gpu].claims.append(Claim(f"ref:{r}", ref_gb + ovh + extra, "always", ref_what
                                                   + (f" + gathered params and forward {extra:.1f}" if extra else "")))
    first = 0 if o.colocate else ranks * (1 + ref)
    graphs = pc.vllm_graphs_gb
    for e in range(engines(cfg) * tp):
        gpu = plan.gpus[first + e]
        gpu.claims.append(Claim(f"vllm:{e // tp}", gpu.cap, "rollout" if o.colocate else "always", VLLM))
        if o.colocate:
            gpu.claims.append(Claim(f"vllm:{e // tp} asleep", ovh + graphs, "train",
                                    f"context {ovh:g} + CUDA graphs {graphs:g} (placement.vllm_graphs_gb): level-1 "
                                    "sleep frees weights and KV cache only; OpenRLHF never passes --vllm.enforce_eager"))
    _openrlhf_host(cfg, plan, s, state - lp + (0.0 if o.adam_offload else bucket))
    return list(range(o.gpus_per_node))


def _openrlhf_host(cfg: Config, plan: Plan, s: Shape, moved_gb: float) -> None:
    """Host RAM of one node: each rank's offloaded DeepSpeed states (``moved_gb``: with adam_offload for the
    whole run, else while the actor sleeps) and each colocated engine's level-1 sleep copy of its weights.
    Both are pinned, in different processes, and torch's caching host allocator keeps pinned blocks after
    they are freed, so they add up rather than alternate."""
    o = cfg.openrlhf
    per_node = o.gpus_per_node
    if o.adam_offload:
        master = s.params * (12 + ACCUM_BYTES[o.grad_accum_dtype]) / (o.nodes * per_node) / GIB
        plan.host.append(Claim("actor offload", per_node * master, "always",
                               f"{per_node} ranks x {master:.1f}: --ds.adam_offload keeps fp32 master, moments and "
                               "gradient partitions in pinned CPU memory (deepspeed_utils.py get_train_ds_config)"))
    elif o.colocate and not cfg.policy.lora.enabled:
        plan.host.append(Claim("actor asleep", per_node * moved_gb, "always",
                               f"{per_node} ranks x {moved_gb:.1f}: offload_deepspeed_states pins optim_states, "
                               "hp_params, lp_grads and the gradient bucket in CPU memory (deepspeed_utils.py)"))
    if o.colocate:
        n = max(1, engines(cfg) // o.nodes)
        w = weights_gb(s, "bfloat16")
        plan.host.append(Claim("vllm asleep", n * w, "always",
                               f"{n} engines x {w:.1f}: level-1 sleep (RolloutRayActor.sleep, openrlhf/trainer/ray/"
                               "vllm_engine.py) backs the bf16 weights up in CPU memory"))


def _local(cfg: Config, plan: Plan) -> list[int]:
    """The local job's learner and rollout workers where their Ray shares put them; returns every GPU."""
    from trainer.learner import place

    placed = place(cfg, float(len(plan.gpus)))
    g, ro = placed.grpo, placed.rollout
    free = [1.0] * len(plan.gpus)
    consumers = [("learner", g.learner_gpus, lambda: _learner_claims(placed))]
    consumers += [(f"worker:{w}", ro.worker_gpus, lambda w=w: _worker_claims(placed, w)) for w in range(ro.num_workers)]
    for who, share, claims in consumers:  # sized only when on a GPU: a CPU run needs no model shapes
        slot = next((i for i, f in enumerate(free) if f >= min(share, 1.0) - 1e-9), None) if share else None
        if slot is None:
            plan.cpu.append(who)
            if share:
                plan.problems.append(f"{who}: its Ray share {share:g} GPU finds no GPU with that much left")
            continue
        free[slot] -= min(share, 1.0)
        for c in claims():
            c.gb = c.gb or min(share, 1.0) * plan.gpus[slot].cap  # a vLLM engine: at most its share
            plan.gpus[slot].claims.append(dataclasses.replace(c, what=f"{c.what} (Ray share {share:g})"))
    return list(range(len(plan.gpus)))


def learner_gb(cfg: Config, s: Shape, seq: int, scored: int) -> tuple[float, str]:
    """(GiB, how) of the local learner with micro-batches of ``seq``-token rows, ``scored`` of them
    trained: policy state, frozen reference and one micro-batch's activations (no process overhead)."""
    state, how = _policy_state(cfg, s, None)
    ref = weights_gb(s, gpu_dtype(cfg.policy.dtype)) if cfg.grpo.kl_coef > 0 and not cfg.policy.lora.enabled else 0.0
    acts, what = _train_acts(cfg, s, seq, scored, residual=4)
    return state + ref + acts, f"{how} {state:.1f} + reference {ref:.1f} + {what}"


def _learner_claims(cfg: Config) -> list[Claim]:
    """The local learner at the longest rows (``rollout.max_seq_len``)."""
    ro, ovh = cfg.rollout, cfg.placement.process_overhead_gb
    scored = ro.max_seq_len if ro.train_stage1 else ro.max_new_tokens_stage2
    gb, how = learner_gb(cfg, shape_of(cfg.policy.model), ro.max_seq_len, scored)
    return [Claim("learner", gb + ovh, what=f"{how} + {ovh:g}")]


def _worker_claims(cfg: Config, w: int) -> list[Claim]:
    """A local rollout worker: its engine (vLLM: sized last; transformers: weights, KV slots and the
    prefix cache, a prefill pass) and, with the conversation head on a GPU, its crisis-check backbone."""
    ro, sc, ovh = cfg.rollout, cfg.safety, cfg.placement.process_overhead_gb
    if ro.engine == "vllm":
        claims = [Claim(f"worker:{w}", 0.0, what=VLLM)]
    else:
        from rollout.engines.hf_engine import PREFILL_TOKENS

        s, dtype = shape_of(cfg.policy.model), gpu_dtype(ro.dtype)
        w_gb, kv = weights_gb(s, dtype), kv_gb(s, ro.max_batch * ro.max_seq_len + ro.prefix_cache_tokens, BYTES[dtype])
        fwd = forward_gb(s, PREFILL_TOKENS, BYTES[dtype])
        claims = [Claim(f"worker:{w}", w_gb + kv + fwd + ovh,
                        what=f"{dtype} weights {w_gb:.1f} + KV {kv:.1f} + prefill {fwd:.1f} + {ovh:g}")]
    if ro.device != "cpu" and sc.rollout_metric and sc.backbone and sc.conv_device != "cpu":
        s = shape_of(sc.backbone)
        claims.append(Claim(f"safety:{w}", weights_gb(s, "float32") + forward_gb(s, sc.conv_batch * ro.max_seq_len, 2),
                            what=f"{sc.backbone} float32 + a {sc.conv_batch}-conversation forward"))
    return claims


def _services(cfg: Config) -> list[tuple[str, str, object]]:
    """(name, device setting, claim maker) of the reward and retriever servers the job starts itself."""
    r, e, ovh, out = cfg.reward, cfg.retriever, cfg.placement.process_overhead_gb, []

    def reward() -> Claim:
        s, tokens = shape_of(r.backbone), r.max_batch * r.max_length
        dtype = gpu_dtype(r.dtype)
        w, f = weights_gb(s, dtype), forward_gb(s, tokens, BYTES[dtype])
        return Claim("reward", w + f + ovh, what=f"{r.backbone} {dtype} {w:.1f} + forward of "
                     f"{r.max_batch}x{r.max_length} tokens {f:.1f} + {ovh:g}")

    def embedder() -> Claim:
        s, tokens = shape_of(e.embedder), e.embed_batch_size * cfg.rollout.max_new_tokens_stage1
        w, f = weights_gb(s, "float32"), forward_gb(s, tokens, 4)
        return Claim("embedder", w + f + ovh, what=f"{e.embedder} float32 {w:.1f} + forward of "
                     f"{e.embed_batch_size} queries {f:.1f} + {ovh:g}")

    if not r.url and not r.rule:
        out.append(("reward", r.device, reward))
    if cfg.rollout.rag and not e.url:
        out.append(("embedder", e.device, embedder))
    return out


def _put_service(plan: Plan, who: str, device: str, claim, home: list[int]) -> None:
    """A service on its ``cuda:N``, else on the GPU of ``home`` with the most room; on the CPU (and not
    sized) when its device is cpu or there is no GPU."""
    if device == "cpu" or not plan.gpus or not home:
        plan.cpu.append(who)
        return
    index = int(device.split(":")[1]) if ":" in device else min(home, key=lambda i: (plan.gpus[i].peak_gb, i))
    plan.gpus[index].claims.append(claim())


def _fit_vllm(cfg: Config, plan: Plan) -> None:
    """One ``gpu_memory_utilization`` for every engine: ``rollout.vllm_gpu_memory``, lowered to what
    the other claims of its phase leave on the fullest engine GPU; it must hold the weights and the KV
    cache of one longest sequence."""
    claims = [(g, c) for g in plan.gpus for c in g.claims if c.what.startswith(VLLM)]
    if not claims:
        return
    want = util = cfg.rollout.vllm_gpu_memory
    for g, c in claims:
        left = min(c.gb, g.cap - (g.need(c.phase) - c.gb))
        util = min(util, math.floor(100 * max(left, 0.0) / g.cap) / 100)
    s, b = shape_of(cfg.policy.model), BYTES[gpu_dtype(cfg.policy.dtype)]
    tp = cfg.openrlhf.vllm_tensor_parallel if plan.backend == "openrlhf" else 1
    seq = cfg.openrlhf.max_len if plan.backend == "openrlhf" else cfg.rollout.max_seq_len
    need = weights_gb(s, gpu_dtype(cfg.policy.dtype)) / tp + kv_gb(s, seq, b) / tp
    for g, c in claims:
        c.gb, c.what = util * g.cap, (f"{VLLM}: {util:g} of the GPU's {g.cap:g} (its CUDA graphs inside, vLLM >= 0.21; "
                                      f"weights {need:.1f} with one {seq}-token KV)")
    plan.vllm_gpu_memory = util
    if util < want:
        plan.notes.append(f"rollout.vllm_gpu_memory lowered from {want:g} to {util:g}: what the other claims leave")
    if util * claims[0][0].cap < need:
        plan.problems.append(f"{claims[0][1].who}: vLLM needs {need:.1f} GiB for the weights and one {seq}-token "
                             f"sequence, but only {util:g} x {claims[0][0].cap:g} GiB is left for it")


def job_gpus(cfg: Config, ray_gpus: float | None = None) -> tuple[int, float]:
    """(count, GiB each) a run plans for. Without ``ray_gpus`` (``--dry-run``, the OpenRLHF backend):
    ``placement.gpus`` (the local backend: none, the CPU). The local job passes its Ray cluster's GPU
    count, which wins; their memory is ``placement.gpus``'s, else the smallest torch reports here."""
    given = parse_gpus(cfg.placement.gpus) if cfg.placement.gpus else None
    if ray_gpus is None:
        if given is None and cfg.grpo.backend == "openrlhf":
            raise ConfigError("placement.gpus: the OpenRLHF backend plans for the GPUs named here, e.g. 2x80 "
                              "(count x GiB; --gpus on the command line)")
        return given or (0, 0.0)
    count = int(ray_gpus)
    if count == 0 or given:
        return count, given[1] if given else 0.0
    import torch

    if not torch.cuda.is_available():
        raise ConfigError(f"placement.gpus: Ray has {count} GPU(s) but this process sees none to read their "
                          "memory; set it, e.g. 1x80 (count x GiB)")
    gb = min(torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count())) / GIB
    return count, math.floor(10 * gb) / 10


def plan_for(cfg: Config, ray_gpus: float | None = None) -> Plan:
    """``make_plan`` on the run's GPUs (``job_gpus``)."""
    return make_plan(cfg, job_gpus(cfg, ray_gpus))


def service_devices(plan: Plan) -> dict[str, int | None]:
    """The GPU of each server the job starts (``ray_jobs.services.JobServices``'s names)."""
    return {"reward": plan.device("reward"), "retriever": plan.device("embedder")}
