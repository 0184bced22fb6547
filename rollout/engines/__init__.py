"""The generation engines behind one interface, and ``make_engine`` (config -> engine).

Parts: ``base`` (``GenerationEngine``, ``SamplingParams``, ``Generation``, ``EngineScheduler``: the
types every engine and caller shares), ``hf_engine`` (transformers, continuous batching on the CPU or
a GPU), ``decoder`` (its compiled slot decoder) and ``vllm_engine`` (vLLM on a GPU or with its CPU build, imported lazily).
The factory lives here, above what it builds; the engines import ``base``, never this module, so there
is no cycle. Nothing heavy is imported at package import.
"""

from __future__ import annotations

from rollout.engines.base import GenerationEngine


def make_engine(cfg, model_spec: str | None = None, seed: int | None = None) -> GenerationEngine:
    """The engine ``cfg.rollout.engine`` names, for ``model_spec`` (default ``cfg.policy.model``)."""
    from escrag.models import engine_dtype

    spec = model_spec or cfg.policy.model
    seed = cfg.run.seed if seed is None else seed
    if cfg.rollout.engine == "vllm":
        from rollout.engines.vllm_engine import VLLMEngine, vllm_dtype

        ro = cfg.rollout
        return VLLMEngine(spec, dtype=vllm_dtype(cfg), seed=seed, gpu_memory_utilization=ro.vllm_gpu_memory,
                          max_model_len=ro.max_seq_len, kv_cache_gb=ro.vllm_kv_cache_gb,
                          enforce_eager=ro.vllm_enforce_eager)
    from rollout.engines.hf_engine import HFEngine

    dtype = engine_dtype(cfg.rollout.dtype, cfg.policy.compute_dtype, cfg.rollout.device)
    return HFEngine(spec, cfg.rollout, dtype=dtype, seed=seed)
