"""Two policies' answers to the same states with the same seeds, every answer kept (issue 26).

Owns: ``answer_records`` (one record per answer: state id, sample, seed, output, think, response,
exemplar ids and strategies, RM score, format reward, reward, risk, named and gold strategy),
``named_strategy`` (the ESConv strategy a think block names, when it names exactly one), ``block``
(two policies' means of one per-answer score and their paired difference over states) and
``summarize``: per policy the format rate, the RM mean over all answers, the RM mean over the answers
that parse in *both* policies (same state and sample), the reward (RM + format) and the strategy
accuracy (``escrag.data.strategy_hit``, the reward of the rule ``strategy:SPLIT``: the think block
names exactly one ESConv strategy and it is one of the gold turn's labels), each with a bootstrap
interval over states and the paired difference of the second policy minus the first; the strategy
accuracy also with a Wilson interval over answers, beside two baselines needing no policy: the
majority class of the train split and the first strategy of each answer's top retrieved exemplar.

Why the both-parse RM mean: an unparsed output scores a format point less and usually a lower RM
score too, so fewer broken formats alone raise the RM mean over all answers; over the answers that
parse in both policies, the RM difference is about what the responses say.
"""

from __future__ import annotations

from collections import Counter

from escrag.data import DialogueState, load_states, named_strategies, strategy_hit
from escrag.stats import bootstrap_ci, wilson

METRICS = ("format", "rm", "reward", "strategy_hit")


def named_strategy(think: str) -> str:
    """The ESConv strategy ``think`` names when it names exactly one, else ""."""
    named = named_strategies(think)
    return named[0] if len(named) == 1 else ""


def majority_strategy(split: str = "train") -> str:
    """The most common first strategy label of the split's gold counselor turns."""
    return Counter(s.strategies[0] for s in load_states(split) if s.strategies).most_common(1)[0][0]


def answer_records(policy: str, jobs: list[tuple[DialogueState, int, int]], answers: list[dict],
                   parts: list[dict], risks: list[str | None]) -> list[dict]:
    """One JSON-ready record per answer; ``jobs`` are (state, sample index, seed) in answer order."""
    out = []
    for (s, j, seed), a, p, risk in zip(jobs, answers, parts, risks):
        named = named_strategy(a["think"])
        top = a["exemplars"][0]["strategies"] if a["exemplars"] else []
        out.append({"policy": policy, "state_id": s.state_id, "sample": j, "seed": seed,
                    "output": a["output"], "think": a["think"], "response": a["response"],
                    "initial_output": a["initial_output"],
                    "exemplar_ids": [e.get("id") for e in a["exemplars"]],
                    "exemplar_strategies": [e["strategies"] for e in a["exemplars"]],
                    "rm": p["rm_scores"], "format": p["format_rewards"], "reward": p["rewards"], "risk": risk,
                    "gold_strategies": list(s.strategies), "named_strategy": named,
                    "strategy_hit": strategy_hit(a["think"], s.strategies),
                    "top_exemplar_strategy": top[0] if top else ""})
    return out


def per_state(recs: list[dict], key: str) -> dict[str, float]:
    """Each state's mean of ``key`` over its records (a state's answers)."""
    by: dict[str, list[float]] = {}
    for r in recs:
        by.setdefault(r["state_id"], []).append(r[key])
    return {sid: sum(v) / len(v) for sid, v in by.items()}


def block(recs: dict[str, list[dict]], key: str, ci: tuple) -> dict:
    """Each policy's mean of ``key`` and the paired difference (second minus first), over states."""
    (a, ra), (b, rb) = recs.items()
    pa, pb = per_state(ra, key), per_state(rb, key)
    shared = [sid for sid in pa if sid in pb]
    return {a: bootstrap_ci(list(pa.values()), *ci), b: bootstrap_ci(list(pb.values()), *ci),
            "delta": bootstrap_ci([pb[s] - pa[s] for s in shared], *ci), "states": len(shared)}


def _strategy(recs: dict[str, list[dict]], gold: list[list[str]], majority: str, ci: float) -> dict:
    """Shares of answers whose strategy is a gold label, Wilson intervals: each policy, and baselines."""
    out = {name: wilson(int(sum(r["strategy_hit"] for r in rs)), len(rs), ci) for name, rs in recs.items()}
    out["majority_class"] = wilson(sum(majority in g for g in gold), len(gold), ci)
    out["majority_label"] = majority
    for name, rs in recs.items():
        hits = sum(bool(r["top_exemplar_strategy"]) and r["top_exemplar_strategy"] in r["gold_strategies"] for r in rs)
        out[f"top_exemplar_{name}"] = wilson(hits, len(rs), ci)
    return out


def summarize(records: list[dict], resamples: int, ci: float, seed: int) -> dict:
    """The comparison of the two policies in ``records`` (in order of first appearance): see the module doc."""
    names = list(dict.fromkeys(r["policy"] for r in records))
    recs = {n: [r for r in records if r["policy"] == n] for n in names}
    boot = (resamples, ci, seed)
    out = {"answers": {n: len(rs) for n, rs in recs.items()},
           **{k: block(recs, k, boot) for k in METRICS}}
    key = {n: {(r["state_id"], r["sample"]): r for r in rs} for n, rs in recs.items()}
    both = [k for k in key[names[0]] if k in key[names[1]] and all(key[n][k]["format"] for n in names)]
    out["rm_both_parse"] = {**block({n: [key[n][k] for k in both] for n in names}, "rm", boot), "answers": len(both)}
    gold = [r["gold_strategies"] for r in recs[names[0]]]
    out["strategy_accuracy"] = _strategy(recs, gold, majority_strategy(), ci)
    return out
