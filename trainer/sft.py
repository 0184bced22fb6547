"""Cold-start SFT (paper eq. 6): teach the policy the ``<think>..</think><response>..</response>`` format.

Owns: the demonstrations file schema, bootstrapping demonstrations from ESConv train, the SFT loop
(loss only on the assistant tokens, LoRA or full fine-tuning) and the ``escrag sft`` command.

Demonstrations JSONL, one object per line:
    {"history": [{"role": "user"|"assistant", "content": str}, ...],   # ends with a "user" turn
     "output": "<think>...</think><response>...</response>"}
or, instead of "output", the two parts {"think": str, "response": str}. The prompt is the stage-1
prompt (``escrag.prompts.stage1_messages``), the target is the output followed by the end-of-turn token.

Departures from the paper: the paper used 500 demonstrations written by GPT-4o. Without a teacher
model, the embedded default bootstraps them from ESConv train: think = a short rationale built from
the annotated strategy of the gold turn, the dialogue's emotion and problem type; response = the gold
counselor turn. They teach the format and a plausible reasoning shape, not deep reasoning. Under LoRA
the adapter is merged and the merged model saved, so later stages just load a folder.
"""

from __future__ import annotations

import math
import random
import sys
import time
from pathlib import Path

from escrag.config import Config, load_config, output_path
from escrag.data import DialogueState, load_states, read_jsonl
from escrag.errors import UserError
from escrag.formats import compose, parse_output
from escrag.prompts import render, stage1_messages

STRATEGY_PLANS = {
    "Question": "ask an open question to understand their situation better",
    "Restatement or Paraphrasing": "restate what they said so they feel heard",
    "Reflection of feelings": "reflect their feelings back and validate them",
    "Self-disclosure": "share a brief related experience to show they are not alone",
    "Affirmation and Reassurance": "affirm their strengths and reassure them",
    "Providing Suggestions": "gently offer a concrete suggestion",
    "Information": "give useful information about their situation",
    "Others": "stay warm and keep the conversation going",
}


def rationale(state: DialogueState) -> str:
    """The bootstrapped think text: the client's state, then the plan from the gold turn's strategy."""
    emotion = state.emotion or "distress"
    problem = state.problem or "a difficult situation"
    plans = [STRATEGY_PLANS.get(s, STRATEGY_PLANS["Others"]) for s in state.strategies] or [STRATEGY_PLANS["Others"]]
    names = ", ".join(state.strategies) or "Others"
    return (f"The client is feeling {emotion} about {problem}. "
            f"Strategy: {names}. I should {' and '.join(plans)}.")


def bootstrap_demonstrations(states: list[DialogueState], n: int, seed: int = 0) -> list[dict]:
    """``n`` demonstrations from a seeded sample of ESConv states (all when there are fewer)."""
    pool = [s for s in states if s.target.strip()]
    picked = random.Random(seed).sample(pool, min(n, len(pool)))
    return [{"history": s.history,
             "output": compose(rationale(s), s.target),
             "id": f"{s.dialogue_id}/{s.turn_index}"} for s in picked]


def _check_demo(obj, where: str) -> dict:
    if not isinstance(obj, dict):
        raise UserError(f"{where}: a demonstration must be a JSON object")
    hist = obj.get("history")
    if (not isinstance(hist, list) or not hist or not all(isinstance(m, dict) and isinstance(m.get("content"), str)
                                                           and m.get("role") in ("user", "assistant") for m in hist)):
        raise UserError(f"{where}: 'history' must be a non-empty list of {{role: user|assistant, content: str}}")
    if hist[-1]["role"] != "user":
        raise UserError(f"{where}: 'history' must end with a user (client) turn")
    output = obj.get("output")
    if output is None and isinstance(obj.get("think"), str) and isinstance(obj.get("response"), str):
        output = compose(obj["think"], obj["response"])
    if not isinstance(output, str):
        raise UserError(f"{where}: needs 'output' (str) or both 'think' and 'response' (str)")
    parsed = parse_output(output)
    if not parsed.ok:
        raise UserError(f"{where}: output is not in the think/response format ({parsed.reason})")
    return {"history": hist, "output": output}


def load_demonstrations(path: str | Path) -> list[dict]:
    path = Path(path)
    demos = [_check_demo(obj, where) for where, _, obj in read_jsonl(path, "demonstrations file", UserError)]
    if not demos:
        raise UserError(f"{path}: no demonstrations")
    return demos


def encode(tok, demo: dict, max_length: int, max_turns: int | None) -> tuple[list[int], list[int]]:
    """(input_ids, labels) with labels -100 outside the assistant output; long prompts lose their
    left part first, and an output longer than ``max_length`` is cut at the end."""
    prompt = tok(render(tok, stage1_messages(demo["history"], max_turns)), add_special_tokens=False)["input_ids"]
    target = tok(demo["output"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    target = target[:max_length - 1]
    prompt = prompt[-(max_length - len(target)):]
    return prompt + target, [-100] * len(prompt) + target


def _micro_nll(model, batch: list[tuple[list[int], list[int]]], pad_id: int):
    """Sum of token NLLs over the assistant tokens of one micro-batch (eq. 6)."""
    import torch

    from trainer.policy import tail_logprobs

    counts = [sum(1 for y in labels if y != -100) for _, labels in batch]  # targets are the tail
    keep = max(counts)
    mask = torch.tensor([[0.0] * (keep - n) + [1.0] * n for n in counts])
    return -tail_logprobs(model, [ids for ids, _ in batch], mask, pad_id).sum()


def _resolve_demos(cfg: Config, data: str | None) -> tuple[list[dict], str]:
    source = data or cfg.sft.data
    if source:
        return load_demonstrations(source)[: cfg.sft.num_examples], str(source)
    states = load_states(cfg.data.train)
    return bootstrap_demonstrations(states, cfg.sft.num_examples, cfg.run.seed), f"bootstrap:{cfg.data.train}"


def train_sft(cfg: Config, data: str | None = None, out: str | Path | None = None, log=print,
              examples=None) -> dict:
    """Cold-start SFT; saves a plain model folder at ``out`` (default ``<output_dir>/sft``) and
    returns a summary {"path", "examples", "steps", "losses", "seconds"}. ``examples(tokenizer) ->
    ([(input_ids, labels)], source)`` replaces the demonstrations (the mechanism task's two stages)."""
    import torch

    from escrag.progress import progress_bar
    from trainer.policy import build_policy, compute, save_merged

    sc = cfg.sft
    torch.manual_seed(cfg.run.seed)
    out = Path(out) if out else output_path(cfg, "sft")
    model, tok = build_policy(cfg.policy)
    if examples is None:
        demos, source = _resolve_demos(cfg, data)
        encoded = [encode(tok, d, sc.max_length, cfg.data.max_history_turns) for d in demos]
    else:
        encoded, source = examples(tok)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=sc.lr, weight_decay=0.0)
    per_step = sc.batch_size * sc.grad_accum
    total = sc.max_steps or sc.epochs * math.ceil(len(encoded) / per_step)
    rng, order, losses, t0 = random.Random(cfg.run.seed), [], [], time.time()
    log(f"[sft] {len(encoded)} demonstrations from {source}; {total} steps of {per_step} "
        f"({'LoRA' if cfg.policy.lora.enabled else 'full'} fine-tuning of {cfg.policy.model})")
    for _ in progress_bar(range(total), desc="sft", unit="step", file=sys.stderr):
        opt.zero_grad(set_to_none=True)
        if len(order) < per_step:
            order += rng.sample(range(len(encoded)), len(encoded))
        chosen, order = order[:per_step], order[per_step:]
        micro = [[encoded[i] for i in chosen[j:j + sc.batch_size]] for j in range(0, per_step, sc.batch_size)]
        n_tok = sum(sum(1 for y in ex[1] if y != -100) for mb in micro for ex in mb)
        step_loss = 0.0
        for mb in micro:
            with compute(cfg.policy, model):
                nll = _micro_nll(model, mb, tok.pad_token_id)
            (nll / n_tok).backward()
            step_loss += nll.item() / n_tok
        torch.nn.utils.clip_grad_norm_(params, sc.max_grad_norm)
        opt.step()
        losses.append(step_loss)
    model.eval()
    summary = {"examples": len(encoded), "source": source, "steps": total, "losses": losses,
               "seconds": round(time.time() - t0, 1), "base_model": cfg.policy.model}
    save_merged(model, tok, out, meta={"stage": "sft", **summary})
    log(f"[sft] loss {losses[0]:.3f} -> {losses[-1]:.3f}; saved {out} ({summary['seconds']} s)")
    return {"path": str(out), **summary}


def main(args) -> int:
    """``escrag sft [--data FILE] [--out DIR] [--config FILE] [-o key=value]``."""
    cfg = load_config(args.config, args.override)
    train_sft(cfg, data=args.data, out=args.out)
    return 0
