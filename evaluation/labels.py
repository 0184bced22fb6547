"""Rewards against people: ESConv's human labels on held-out dialogues, and an independent proxy.

    escrag eval labels --config FILE [--rm NAME=HEAD_DIR ...] [--split test] [--answers compare-test.jsonl] --out labels.json

Owns: ``label_items`` (gold counselor turns of held-out dialogues that carry a seeker survey, each
with another dialogue's turn as a negative in the same history), ``check_scorer`` (how a scorer of
(history, reply) agrees with those labels), ``MiniLMProxy`` (the independent proxy, issue 26 item 3)
and ``judge_answers`` (the proxy's paired verdict on a policy comparison's saved answers, ``--answers``).

The checks, each over held-out dialogues with a bootstrap interval over dialogues:
- ``empathy`` / ``relevance``: a dialogue's score is the mean score of its gold turns; pairwise
  accuracy is the share of (high-rated, low-rated) dialogue pairs whose high one scores more (ties
  half: the AUC), Spearman the rank correlation of the score with the rating over all dialogues.
- ``other_dialogue``: the share of states where the gold turn outscores another dialogue's turn
  placed after the same history (ties half).
- ``generic`` (with ``--generic FILE``, one reply a line, ``#`` comments): the share of (state, reply)
  pairs where a generic reply of the file, placed after the state's history, outscores the gold turn
  (ties half); a dialogue's value is the mean over its states and replies.

The MiniLM proxy shares nothing with the training reward but ESConv: its features are
all-MiniLM-L6-v2 sentence embeddings (the training RM reads a SmolLM2 layer's hidden states), of the last
client turn h and the reply r: [h * r, |h - r|, r]; its head is a logistic regression; its pairs are
gold turns against another dialogue's turn (the training RM's are silver corruptions of gold turns),
from train dialogues only. What it shares: ESConv's text, and the MiniLM embedder is the retriever's,
so the policy's exemplars were chosen by the same embedding (not its reward). It is fitted on train
and judged on the held-out split; ``check_disjoint`` refuses any overlap.
"""

from __future__ import annotations

import random

import numpy as np

from escrag.config import Config
from escrag.data import DialogueState, dialogue_states, load_dialogues, load_surveys
from escrag.errors import UserError
from escrag.stats import bootstrap_ci


def label_items(split: str, per_dialogue: int, seed: int, surveyed: bool = True,
                max_dialogues: int | None = None) -> list[dict]:
    """Up to ``per_dialogue`` seeded gold states per dialogue of ``split`` (only surveyed ones when
    ``surveyed``; a seeded sample of ``max_dialogues`` when given), each with ``other``: the gold turn
    of a state from another dialogue."""
    surveys = load_surveys(split) if surveyed else {}
    rng = random.Random(f"{seed}/labels/{split}")
    dialogues = load_dialogues(split)
    if max_dialogues is not None and max_dialogues < len(dialogues):
        dialogues = rng.sample(dialogues, max_dialogues)
    picked: list[DialogueState] = []
    for d in dialogues:
        if surveyed and d.dialogue_id not in surveys:
            continue
        states = list(dialogue_states(d))
        picked += rng.sample(states, min(per_dialogue, len(states)))
    if len({s.dialogue_id for s in picked}) < 2:
        raise UserError(f"{split}: fewer than 2 usable dialogues for the label checks")
    items = []
    for s in picked:
        other = rng.choice(picked)
        while other.dialogue_id == s.dialogue_id:
            other = rng.choice(picked)
        items.append({"dialogue_id": s.dialogue_id, "history": s.history, "gold": s.target, "other": other.target,
                      "survey": surveys.get(s.dialogue_id)})
    return items


def _auc(high: np.ndarray, low: np.ndarray) -> float:
    if not len(high) or not len(low):
        return float("nan")
    diff = high[:, None] - low[None, :]
    return float(((diff > 0) + 0.5 * (diff == 0)).mean())


def _spearman(x: np.ndarray, y: np.ndarray) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(x, y).statistic) if len(set(x)) > 1 and len(set(y)) > 1 else float("nan")


def _boot(stat, n: int, resamples: int, ci: float, seed: int) -> tuple[float, float, float]:
    """(statistic, low, high) of ``stat(index array)`` under resampling the n dialogues."""
    rng = np.random.default_rng(seed)
    vals = np.array([stat(rng.integers(0, n, n)) for _ in range(resamples)])
    vals = vals[~np.isnan(vals)]
    tail = (1 - ci) / 2 * 100
    lo, hi = np.percentile(vals, [tail, 100 - tail]) if len(vals) else (float("nan"),) * 2
    return stat(np.arange(n)), float(lo), float(hi)


def _rating_check(per: np.ndarray, r: np.ndarray, lc, boot: tuple) -> dict:
    high, low = r >= lc.high, r <= lc.low
    return {"high_dialogues": int(high.sum()), "low_dialogues": int(low.sum()),
            "pairwise_accuracy": _boot(lambda ix: _auc(per[ix][high[ix]], per[ix][low[ix]]), len(r), *boot),
            "spearman": _boot(lambda ix: _spearman(per[ix], r[ix]), len(r), *boot)}


def read_replies(path: str) -> list[str]:
    """A list of replies: one a line, blank lines and ``#`` comments skipped."""
    from pathlib import Path

    lines = [ln.strip() for ln in Path(path).read_text().splitlines()]
    replies = [ln for ln in lines if ln and not ln.startswith("#")]
    if not replies:
        raise UserError(f"{path}: no replies (one a line)")
    return replies


def generic_share(score, items: list[dict], generic: list[str], gold: np.ndarray, boot: tuple) -> tuple:
    """How often a generic reply after a state's history outscores its gold turn (module doc)."""
    g = np.asarray(score([(i["history"], r) for i in items for r in generic]), dtype=np.float64)
    g = g.reshape(len(items), len(generic))
    beats = (g > gold[:, None]) + 0.5 * (g == gold[:, None])
    ids = [i["dialogue_id"] for i in items]
    return bootstrap_ci([beats[[k for k, x in enumerate(ids) if x == d]].mean() for d in dict.fromkeys(ids)], *boot)


def check_scorer(score, items: list[dict], cfg: Config, generic: list[str] | None = None) -> dict:
    """``score([(history, reply), ...]) -> [float]`` against the labels of ``items`` (module doc)."""
    lc, boot = cfg.eval.labels, (cfg.eval.bootstrap, cfg.eval.ci, cfg.run.seed)
    gold = np.asarray(score([(i["history"], i["gold"]) for i in items]), dtype=np.float64)
    other = np.asarray(score([(i["history"], i["other"]) for i in items]), dtype=np.float64)
    ids = list(dict.fromkeys(i["dialogue_id"] for i in items))
    where = {d: [k for k, i in enumerate(items) if i["dialogue_id"] == d] for d in ids}
    per = np.array([gold[where[d]].mean() for d in ids])
    win = np.array([np.mean((gold[w] > other[w]) + 0.5 * (gold[w] == other[w])) for w in map(where.get, ids)])
    out = {"dialogues": len(ids), "states": len(items), "other_dialogue": bootstrap_ci(win, *boot)}
    if generic:
        out["generic"] = generic_share(score, items, generic, gold, boot)
    surveys = [items[where[d][0]]["survey"] for d in ids]
    if any(s is None for s in surveys):
        return out
    for label in ("empathy", "relevance"):
        out[label] = _rating_check(per, np.array([s[label] for s in surveys]), lc, boot)
    return out


def check_disjoint(fit: set[str], judged: set[str]) -> None:
    """Raise ``UserError`` when a dialogue the proxy was fitted on is also one it is judged on."""
    both = sorted(fit & judged)
    if both:
        raise UserError(f"the proxy is judged on {len(both)} dialogue(s) it was fitted on (e.g. {', '.join(both[:5])})")


class MiniLMProxy:
    """The independent proxy (module doc): a logistic regression on MiniLM features of (last client
    turn, reply), fitted on gold turns vs another dialogue's turn from train dialogues."""

    def __init__(self, embedder, cfg: Config):
        self.embedder, self.cfg, self.dialogues, self.model = embedder, cfg, set(), None

    def features(self, pairs: list[tuple[list[dict], str]]) -> np.ndarray:
        last = [next((t["content"] for t in reversed(h) if t["role"] == "user"), "") for h, _ in pairs]
        h, r = self.embedder.encode(last), self.embedder.encode([reply for _, reply in pairs])
        return np.concatenate([h * r, np.abs(h - r), r], axis=1)

    def fit(self, items: list[dict]) -> MiniLMProxy:
        from sklearn.linear_model import LogisticRegression

        x = self.features([(i["history"], i["gold"]) for i in items] + [(i["history"], i["other"]) for i in items])
        y = np.r_[np.ones(len(items)), np.zeros(len(items))]
        self.model = LogisticRegression(C=self.cfg.eval.labels.proxy_c, max_iter=2000).fit(x, y)
        self.dialogues, self.fit_pairs = {i["dialogue_id"] for i in items}, len(items)
        return self

    def score(self, pairs: list[tuple[list[dict], str]]) -> list[float]:
        return self.model.decision_function(self.features(pairs)).tolist()


def rm_scorer(head_dir: str, batch: int = 16):
    """A function scoring (history, reply) pairs with the reward head at ``head_dir``, with a progress bar."""
    from escrag.progress import progress_bar
    from reward_server.model import RewardModel

    rm = RewardModel.load(head_dir)

    def score(pairs: list) -> list[float]:
        out: list[float] = []
        with progress_bar(total=len(pairs), desc=f"scoring with {head_dir}", unit="reply") as bar:
            for i in range(0, len(pairs), batch):
                out += rm.score(pairs[i:i + batch])[0]
                bar.update(len(pairs[i:i + batch]))
        return out
    return score


def judge_answers(proxy: MiniLMProxy, path: str, cfg: Config) -> dict:
    """Each policy's mean proxy score of the answers saved by a comparison (``<grpo>/compare-<split>.jsonl``)
    and the paired difference (second policy minus first), bootstrap intervals over states."""
    from escrag.data import load_states, read_jsonl
    from evaluation.compare import block

    records = [obj for _, _, obj in read_jsonl(path, "comparison answers file")]
    states = {s.state_id: s for split in ("valid", "test") for s in load_states(split)}
    check_disjoint(proxy.dialogues, {states[r["state_id"]].dialogue_id for r in records})
    scores = proxy.score([(states[r["state_id"]].history, r["response"]) for r in records])
    for r, x in zip(records, scores):
        r["proxy"] = x
    recs = {n: [r for r in records if r["policy"] == n] for n in dict.fromkeys(r["policy"] for r in records)}
    return block(recs, "proxy", (cfg.eval.bootstrap, cfg.eval.ci, cfg.run.seed))


def fit_proxy(cfg: Config, log=print) -> MiniLMProxy:
    """The MiniLM proxy fitted on train (``eval.labels``: states per dialogue, dialogues sampled)."""
    from escrag.embed import load_embedder

    lc = cfg.eval.labels
    fit = label_items("train", lc.fit_states_per_dialogue, cfg.run.seed, surveyed=False,
                      max_dialogues=lc.proxy_fit_dialogues)
    log(f"[labels] fitting the MiniLM proxy on {len(fit)} train pairs")
    return MiniLMProxy(load_embedder(cfg.retriever.embedder), cfg).fit(fit)


def run_checks(cfg: Config, rms: dict[str, str], split: str, log=print, answers: str | None = None,
               generic: str | None = None) -> dict:
    """The MiniLM proxy fitted on train, then it and each reward head in ``rms`` checked on ``split``."""
    if split == "train":
        raise UserError("the label checks run on held-out dialogues (valid or test), not train")
    items = label_items(split, cfg.eval.labels.states_per_dialogue, cfg.run.seed)
    log(f"[labels] checking on {len(items)} {split} states")
    proxy = fit_proxy(cfg, log)
    check_disjoint(proxy.dialogues, {i["dialogue_id"] for i in items})
    replies = read_replies(generic) if generic else None
    out = {"split": split, "fit_pairs": proxy.fit_pairs, "fit_dialogues": len(proxy.dialogues),
           "generic_file": generic, "scorers": {"minilm_proxy": check_scorer(proxy.score, items, cfg, replies)}}
    for name, head in rms.items():
        log(f"[labels] scoring with {name} ({head})")
        out["scorers"][name] = check_scorer(rm_scorer(head), items, cfg, replies)
    if answers:
        out["answers"] = {"file": answers, "minilm_proxy": judge_answers(proxy, answers, cfg)}
    return out


def main(args) -> int:
    """``escrag eval labels``."""
    from escrag.atomic import write_json
    from escrag.config import load_config

    cfg = load_config(args.config, args.override)
    rms = dict(r.split("=", 1) if "=" in r else (r, r) for r in args.rm)
    res = run_checks(cfg, rms, args.split, answers=args.answers, generic=args.generic)
    write_json(args.out, res)
    for name, r in res["scorers"].items():
        line = f"{name}: other-dialogue {r['other_dialogue'][0]:.3f} [{r['other_dialogue'][1]:.3f}, {r['other_dialogue'][2]:.3f}]"
        for label in ("empathy", "relevance"):
            a, sp = r[label]["pairwise_accuracy"], r[label]["spearman"]
            line += f"; {label} AUC {a[0]:.3f} [{a[1]:.3f}, {a[2]:.3f}] Spearman {sp[0]:+.3f} [{sp[1]:+.3f}, {sp[2]:+.3f}]"
        if "generic" in r:
            line += "; generic beats gold {:.3f} [{:.3f}, {:.3f}]".format(*r["generic"])
        print(line)
    if "answers" in res:
        print("MiniLM proxy on the comparison's answers: " + ", ".join(
            f"{k} {v[0]:+.3f} [{v[1]:+.3f}, {v[2]:+.3f}]" for k, v in res["answers"]["minilm_proxy"].items()
            if isinstance(v, tuple)))
    return 0
