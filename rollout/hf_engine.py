"""The transformers generation engine (CPU or one GPU).

Owns: a plain batched decode loop: left-padded prefill, then one token per step through the KV cache
under ``torch.inference_mode``; each step's draw is ``escrag.sampling.sample`` (temperature, top-k
first and top-p inside the top k, one seed per row; design section 5: HF's full-vocabulary sort costs
32-36 ms per step at batch 8 on this CPU, the top-64-then-top-p sampler ~1.25 ms); greedy when
temperature is 0; stop at EOS (kept as the last completion token, so the learner trains the stop
decision) or right after a stop string.

Departure from HF ``generate``: with ``top_k`` > 0, top-p only sees the top k tokens; in 6-12% of rows
the top 64 hold under 95% of the mass (design section 5), so the sampled distribution is slightly
sharper there. ``rollout.top_k: 0`` restores the full-vocabulary top-p.
"""

from __future__ import annotations

import inspect
import random
import threading

import torch
from transformers import DynamicCache

from escrag.models import load_causal_lm, load_tokenizer, resolve_device
from escrag.sampling import sample
from rollout.engine import Generation, GenerationEngine, SamplingParams, stop_position

STOP_TAIL_TOKENS = 16  # tokens decoded per step to look for a stop string that just completed


class HFEngine(GenerationEngine):
    def __init__(self, model_spec: str, dtype: str = "float32", device: str = "cpu", seed: int = 0,
                 max_batch: int = 64):
        self.device, self.max_batch, self.version = resolve_device(device), max_batch, 0
        self.tokenizer = load_tokenizer(model_spec)
        self.model = load_causal_lm(model_spec, dtype).to(self.device).eval()
        self._named = self.model.state_dict(keep_vars=True)  # tied names map to the same tensor
        self._seed_rng = random.Random(seed)
        self._lock = threading.Lock()
        eos = self.model.generation_config.eos_token_id
        eos = eos if isinstance(eos, list) else [eos]
        # transformers >= 5.2x names the KV-cache argument `cache`; earlier 5.x `past_key_values`
        params = inspect.signature(self.model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self.eos_ids = {i for i in [*eos, self.tokenizer.eos_token_id] if i is not None}

    # ------------------------------------------------------------------ generation

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams,
                 seeds: list[int] | None = None) -> list[Generation]:
        if any(len(p) == 0 for p in prompt_ids):
            raise ValueError("every prompt needs at least one token")
        with self._lock:
            seeds = self.row_seeds(len(prompt_ids), seeds)
            out: list[Generation] = []
            for i in range(0, len(prompt_ids), self.max_batch):
                rows = slice(i, i + self.max_batch)
                out += self._generate_batch(prompt_ids[rows], params, seeds[rows])
            return out

    def _left_pad(self, prompts: list[list[int]]):
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p):] = torch.tensor(p)
            mask[i, width - len(p):] = 1
        return ids.to(self.device), mask.to(self.device)

    @torch.inference_mode()
    def _generate_batch(self, prompts, params: SamplingParams, seeds: list[int]) -> list[Generation]:
        ids, mask = self._left_pad(prompts)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = {self._cache_kw: DynamicCache(config=self.model.config)}  # filled in place
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True,
                         logits_to_keep=1, **cache)  # prefill: only the last position's logits
        next_pos = pos[:, -1:] + 1
        logits = out.logits[:, -1, :]
        rows = [_Row() for _ in prompts]
        seed_t = torch.tensor(seeds, dtype=torch.long, device=self.device)
        for step in range(params.max_new_tokens):
            steps = torch.full_like(seed_t, step)
            tok, logp = sample(logits, params.temperature, params.top_p, params.top_k, seed_t, steps)
            for row, t, lp in zip(rows, tok.tolist(), logp.tolist()):
                if row.reason is None:
                    self._advance(row, t, lp, params)
            if all(r.reason for r in rows) or step == params.max_new_tokens - 1:
                break
            feed = torch.tensor([[r.token_ids[-1] if r.reason is None else self.tokenizer.pad_token_id]
                                 for r in rows], device=self.device)
            mask = torch.cat([mask, mask.new_ones((len(rows), 1))], dim=1)
            out = self.model(input_ids=feed, attention_mask=mask, position_ids=next_pos, use_cache=True,
                             **cache)
            next_pos, logits = next_pos + 1, out.logits[:, -1, :]
        return [self._finish(r, params) for r in rows]

    def _advance(self, row: _Row, token: int, logprob: float, params: SamplingParams) -> None:
        row.token_ids.append(token)
        row.logprobs.append(logprob)
        if token in self.eos_ids:
            row.reason, row.eos = "stop", True
        elif params.stop_strings:
            tail = self.tokenizer.decode(row.token_ids[-STOP_TAIL_TOKENS:], skip_special_tokens=True)
            if stop_position(tail, params.stop_strings) is not None:
                row.reason = "stop"

    def _finish(self, row: _Row, params: SamplingParams) -> Generation:
        text = self.tokenizer.decode(row.token_ids, skip_special_tokens=True)
        cut = stop_position(text, params.stop_strings)
        if cut is not None:
            text = text[:cut]
        return Generation(row.token_ids, row.logprobs, text, row.reason or "length", row.eos)

    # ------------------------------------------------------------------ weights

    def load_weights(self, weights: dict, version: int) -> None:
        """Copy ``weights`` (state-dict names -> tensors) into the model; all names and shapes are
        checked before anything is copied, so a bad dict leaves the engine unchanged."""
        with self._lock:
            self._check_version(version)
            unknown = sorted(set(weights) - set(self._named))
            if unknown:
                raise KeyError(f"unknown parameter names: {unknown[:5]} ({len(unknown)} in all)")
            for name, tensor in weights.items():
                if tuple(tensor.shape) != tuple(self._named[name].shape):
                    raise ValueError(f"{name}: shape {tuple(tensor.shape)} != "
                                     f"{tuple(self._named[name].shape)}")
            with torch.no_grad():
                for name, tensor in weights.items():
                    target = self._named[name]
                    target.copy_(tensor.to(device=target.device, dtype=target.dtype))
            self.version = version


class _Row:
    __slots__ = ("token_ids", "logprobs", "reason", "eos")

    def __init__(self):
        self.token_ids: list[int] = []
        self.logprobs: list[float] = []
        self.reason: str | None = None
        self.eos = False

