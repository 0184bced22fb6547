"""The vLLM generation engine (GPU). vLLM is imported when the engine is built, never at module import,
so this file loads on machines without it; ``tests/gpu/`` exercises it where CUDA and vLLM exist.

Owns: ``VLLMEngine`` (``generate`` over token ids with per-token log-probs, ``load_weights``) and
``WeightSyncExtension``, the worker extension through which weights reach vLLM's workers.

Weights go through vLLM's public RLHF path: the engine is built with ``worker_extension_cls`` naming
``WeightSyncExtension``, and ``load_weights`` calls ``LLM.collective_rpc("escrag_load_weights", ...)``,
which runs on every worker and hands the tensors to the model's own ``load_weights`` (the method vLLM
uses to load checkpoints, which also handles fused q/k/v and gate/up projections), then
``LLM.reset_prefix_cache()`` so no KV computed with the old weights is reused. Tensors travel by
value: fine for one GPU; a multi-GPU cluster uses OpenRLHF's NCCL broadcast instead.

Log-probs are vLLM's ``processed_logprobs`` mode (after temperature and the top-k/top-p cut, needs
vLLM >= 0.10.2). They equal ``escrag.sampling.token_logprobs`` (log-softmax(z / T) over the whole
vocabulary) only without a cut, and bfloat16 kernels differ from the learner's, so with this engine the
learner recomputes π_old (``grpo.recompute_old_logprobs``) and the recorded values only feed the
``logp_diff`` check. Each row gets its own vLLM seed; vLLM's noise is its own, so the same seed draws
different tokens here than in the transformers engine.
"""

from __future__ import annotations

import random

from rollout.engines.base import Generation, GenerationEngine, SamplingParams, stop_position


class WeightSyncExtension:
    """Mixed into vLLM's worker class (``worker_extension_cls``); runs inside each vLLM worker."""

    def escrag_load_weights(self, named_tensors: list) -> int:
        model = self.model_runner.model
        device = next(model.parameters()).device
        model.load_weights(weights=((name, t.to(device)) for name, t in named_tensors))
        return len(named_tensors)


class VLLMEngine(GenerationEngine):
    def __init__(self, model_spec: str, dtype: str = "bfloat16", seed: int = 0, *,
                 gpu_memory_utilization: float, max_model_len: int | None = None):
        """``gpu_memory_utilization``: ``rollout.vllm_gpu_memory``."""
        try:
            import vllm
        except ImportError:
            raise ImportError("rollout.engine 'vllm' needs the vllm package (a CUDA machine; see "
                              "pyproject's 'cluster' extra)") from None
        from escrag.models import load_tokenizer, resolve_model

        self._vllm, self.version, self._seed_rng = vllm, 0, random.Random(seed)
        self.tokenizer = load_tokenizer(model_spec)
        self.llm = vllm.LLM(model=resolve_model(model_spec), dtype=dtype, seed=seed,
                            gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len,
                            logprobs_mode="processed_logprobs", enable_prefix_caching=True,
                            worker_extension_cls="rollout.engines.vllm_engine.WeightSyncExtension")

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
        self._check_version(version)
        named = [(name, t.detach().cpu()) for name, t in weights.items()]
        self.llm.collective_rpc("escrag_load_weights", args=(named,))
        self.llm.reset_prefix_cache()
        self.version = version
