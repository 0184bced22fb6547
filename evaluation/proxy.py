"""The offline proxy report, for machines without a judge endpoint: "offline proxy, not the paper's judge".

Owns: the proxy statistics (``copies``, ``distinct_n``, ``proxy_rows``), the report writers
(``proxy.md`` / ``proxy.csv``, always under the label ``LABEL``, never in the seven-metric tables),
the proxy reward model (``train_proxy_rm``, ``escrag eval proxy-rm``) and the held-out check
(``check_held_out``).

Per system: the mean score of a *proxy* reward model with a 95% bootstrap interval; the format rate
(outputs that parse as think + response, eq. 4); the copy rate (answers sharing a run of
``eval.proxy.copy_ngram`` consecutive words, 8 by default, with one of their retrieved exemplars;
RAG systems only); the mean length in words; distinct-2 (distinct word bigrams / all bigrams over
the system's answers).

The proxy RM must not be the reward the policy was optimised against, nor see test data: it is
trained on silver pairs from ESConv *train* dialogues disjoint from the training RM's (which the RM's
manifest records as ``dialogue_ids``, else its pairs file's dialogues). ``check_held_out`` checks
that the two sets do not overlap, that every id is an ESConv train dialogue, and that no such
dialogue has the same opening turns as a test dialogue; the run refuses a proxy RM that fails it.
"""

from __future__ import annotations

import asyncio
import csv
import hashlib
import io
import json
import random
import re
from pathlib import Path

from escrag.atomic import write_json, write_text
from escrag.cache import JsonlCache, content_key
from escrag.config import Config, ConfigError
from escrag.errors import UserError
from escrag.stats import bootstrap_ci

LABEL = "Offline proxy, not the paper's judge"
FINGERPRINT_TURNS = 4  # opening turns compared between train and test dialogues
_WORD = re.compile(r"[a-z0-9']+")


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def _ngrams(tokens: list[str], n: int) -> set[tuple]:
    return {tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)}


def copies(response: str, exemplars: list[dict], n: int) -> bool:
    """True when ``response`` shares ``n`` (``eval.proxy.copy_ngram``) consecutive words with one exemplar
    (its history or reply)."""
    mine = _ngrams(words(response), n)
    if not mine:
        return False
    return any(mine & _ngrams(words(f"{e.get('history', '')} {e.get('response', '')}"), n) for e in exemplars)


def distinct_n(texts: list[str], n: int = 2) -> float:
    """Distinct word n-grams / all word n-grams over ``texts`` (0 when there are none)."""
    grams = [tuple(w[i:i + n]) for w in map(words, texts) for i in range(len(w) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 0.0


def paired_deltas(records: list[dict], rm: dict, system: str, base: str) -> list[float]:
    """Per test state answered by both systems: proxy score of ``system`` minus that of ``base``."""
    by = {(r["system"], r["state_id"]): rm[r["answer_key"]] for r in records if r["answer_key"] in rm}
    return [v - by[(base, sid)] for (name, sid), v in by.items() if name == system and (base, sid) in by]


def proxy_rows(records: list[dict], systems: dict, rm: dict | None, cfg: Config) -> list[dict]:
    """One row per system; ``delta`` is its paired difference from the first system, state by state,
    with a bootstrap interval over states (tighter than comparing the two unpaired intervals)."""
    rows, first = [], next(iter(systems), None)
    for name, system in systems.items():
        recs = [r for r in records if r["system"] == name]
        texts = [r["response"] for r in recs]
        scores = [rm[r["answer_key"]] for r in recs if rm and r["answer_key"] in rm]
        ci = (cfg.eval.bootstrap, cfg.eval.ci, cfg.run.seed)
        rows.append({
            "system": name, "label": system.label or name, "n": len(recs),
            "rm_score": bootstrap_ci(scores, *ci) if rm else None,
            "delta": bootstrap_ci(paired_deltas(records, rm, name, first), *ci) if rm and name != first else None,
            "format_rate": sum(r["format_ok"] for r in recs) / len(recs) if recs else float("nan"),
            "copy_rate": (sum(copies(r["response"], r["exemplars"], cfg.eval.proxy.copy_ngram) for r in recs)
                          / len(recs)) if system.rag and recs else None,
            "mean_words": sum(len(words(t)) for t in texts) / len(texts) if texts else float("nan"),
            "distinct_2": distinct_n(texts, 2)})
    return rows


def _fmt(v, pct=False) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, tuple):
        return f"{v[0]:.3f} [{v[1]:.3f}, {v[2]:.3f}]"
    return f"{100 * v:.1f}%" if pct else f"{v:.2f}"


def proxy_markdown(rows: list[dict], notes: list[str]) -> str:
    lines = [f"# {LABEL}", "", *notes, "",
             "| System | proxy RM score | Δ vs first row (paired) | format rate | copy rate | mean words | distinct-2 | n |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['label']} | {_fmt(r['rm_score'])} | {_fmt(r.get('delta'))} | {_fmt(r['format_rate'], True)} | "
                     f"{_fmt(r['copy_rate'], True)} | {_fmt(r['mean_words'])} | {r['distinct_2']:.3f} | {r['n']} |")
    return "\n".join(lines) + "\n"


def proxy_csv(rows: list[dict]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["label_note", "system", "label", "n", "rm_score", "rm_score_lo", "rm_score_hi", "delta",
                "delta_lo", "delta_hi", "format_rate", "copy_rate", "mean_words", "distinct_2"])
    for r in rows:
        rm, delta = r["rm_score"] or ("", "", ""), r.get("delta") or ("", "", "")
        w.writerow([LABEL, r["system"], r["label"], r["n"], *rm, *delta, r["format_rate"],
                    "" if r["copy_rate"] is None else r["copy_rate"], r["mean_words"], r["distinct_2"]])
    return buf.getvalue()


# ----------------------------------------------------------------------------- proxy RM scores


def _head_identity(rm_dir: Path) -> str:
    manifest = json.loads((rm_dir / "manifest.json").read_text())
    head = hashlib.sha256((rm_dir / "head.safetensors").read_bytes()).hexdigest()
    return content_key({"head": head, "backbone": manifest.get("backbone_fingerprint"),
                        "max_length": manifest.get("max_length")})


async def _score(url: str, cfg: Config, todo: list, cache: JsonlCache, batch: int = 16) -> None:
    from reward_server.client import RewardClient

    client = RewardClient(url, cfg.reward)
    try:
        for i in range(0, len(todo), batch):
            chunk = todo[i:i + batch]
            out = await client.score([{"history": h, "output": text} for _, h, text in chunk])
            for (key, _, _), score in zip(chunk, out["rm_scores"]):
                cache.put(key, {"score": float(score)})
    finally:
        await client.aclose()


def rm_scores(cfg: Config, run_dir: Path, records: list, histories: dict, config_file: Path,
              log_fn=print) -> dict:
    """answer key -> proxy RM score of the client-facing response, through a cache."""
    from escrag.web.procs import ServerProcess

    rm_dir = Path(cfg.eval.proxy.rm_dir)
    check_proxy_rm(cfg, rm_dir)
    ident = _head_identity(rm_dir)
    cache = JsonlCache(run_dir / "cache" / "proxy_rm.jsonl")
    keys = {r["answer_key"]: content_key({"rm": ident, "history": histories[r["state_id"]],
                                          "response": r["response"]}) for r in records}
    todo = {keys[r["answer_key"]]: (keys[r["answer_key"]], histories[r["state_id"]], r["response"])
            for r in records if keys[r["answer_key"]] not in cache}
    if todo:
        args = ["reward", "--rm", str(rm_dir), "--config", str(config_file)]
        log_fn(f"[eval] proxy: scoring {len(todo)} answers with escrag serve {' '.join(args)}")
        server = ServerProcess("proxy-reward", args, run_dir / "logs", cfg.run.server_timeout_s)
        try:
            asyncio.run(_score(server.url, cfg, list(todo.values()), cache))
        finally:
            server.stop()
    return {a: cache.get(k)["score"] for a, k in keys.items()}


def write_proxy_report(cfg: Config, run_dir: Path, records: list, histories: dict, systems: dict,
                       config_file: Path, log_fn=print) -> list[str]:
    rm = rm_scores(cfg, run_dir, records, histories, config_file, log_fn) if cfg.eval.proxy.rm_dir else None
    rows = proxy_rows(records, systems, rm, cfg)
    rm_note = (f"Proxy RM: `{cfg.eval.proxy.rm_dir}`, trained on ESConv train dialogues disjoint from the "
               f"training RM's (`{training_rm_dir(cfg)}`; checked)." if rm else
               "No proxy RM configured (eval.proxy.rm_dir): surface statistics only.")
    notes = [f"**{LABEL}.** These numbers are not the seven-metric LLM judge and are not comparable to the "
             "paper's tables.", rm_note,
             f"Copy rate: answers sharing >= {cfg.eval.proxy.copy_ngram} consecutive words with one of "
             "their retrieved exemplars (RAG systems). Distinct-2 over each system's answers."]
    write_text(run_dir / "proxy.md", proxy_markdown(rows, notes))
    write_text(run_dir / "proxy.csv", proxy_csv(rows))
    return [str(run_dir / "proxy.md"), str(run_dir / "proxy.csv")]


# ----------------------------------------------------------------------------- held-out check


def rm_dialogues(rm_dir: str | Path) -> set[str]:
    """The dialogues a reward model was trained on (its manifest's ``dialogue_ids``, else every
    dialogue of its pairs file)."""
    from escrag.pairs import load_pairs
    from reward_server.model import read_manifest

    manifest = read_manifest(rm_dir)
    if "dialogue_ids" in manifest:
        return set(manifest["dialogue_ids"])
    pairs = Path(manifest.get("pairs", ""))
    if not pairs.is_file():
        raise UserError(f"{rm_dir}: cannot tell which dialogues it was trained on (no dialogue_ids in its "
                        f"manifest and its pairs file {pairs} is gone)")
    return {p.group for p in load_pairs(pairs)}


def _fingerprint(turns) -> str:
    return "\n".join(t.content.strip().lower() for t in turns[:FINGERPRINT_TURNS])


def check_held_out(proxy_ids: set[str], training_ids: set[str]) -> dict:
    """Raise ``UserError`` unless the proxy RM's and the training RM's dialogues are disjoint ESConv
    train dialogues, none with the opening turns of a test dialogue; return counts."""
    from escrag.data import load_dialogues

    overlap = sorted(proxy_ids & training_ids)
    if overlap:
        raise UserError(f"proxy RM shares {len(overlap)} dialogue(s) with the training RM "
                        f"(e.g. {', '.join(overlap[:5])}): it must be trained on other dialogues")
    train = {d.dialogue_id: d for d in load_dialogues("train")}
    unknown = sorted((proxy_ids | training_ids) - set(train))
    if unknown:
        raise UserError(f"{len(unknown)} reward-model dialogue(s) are not ESConv train dialogues "
                        f"(e.g. {', '.join(unknown[:5])}): test and valid stay unseen")
    test = {_fingerprint(d.turns) for d in load_dialogues("test")}
    dup = sorted(i for i in proxy_ids | training_ids if _fingerprint(train[i].turns) in test)
    if dup:
        raise UserError(f"reward-model dialogue(s) {', '.join(dup[:5])} open like a test dialogue")
    return {"proxy_dialogues": len(proxy_ids), "training_dialogues": len(training_ids)}


def training_rm_dir(cfg: Config) -> str:
    path = cfg.eval.proxy.training_rm_dir or cfg.reward.head_dir
    if not path:
        raise ConfigError("eval.proxy.training_rm_dir: the reward model the policy was trained against is "
                          "needed to check that the proxy RM never saw its dialogues")
    return path


def check_proxy_rm(cfg: Config, rm_dir: Path) -> dict:
    return check_held_out(rm_dialogues(rm_dir), rm_dialogues(training_rm_dir(cfg)))


# ----------------------------------------------------------------------------- proxy RM training


def proxy_dialogue_set(cfg: Config, exclude: set[str]) -> set[str]:
    """ESConv train dialogues outside ``exclude``; a seeded sample of ``eval.proxy.train_dialogues``."""
    from escrag.data import load_dialogues

    free = sorted(d.dialogue_id for d in load_dialogues("train") if d.dialogue_id not in exclude)
    n = cfg.eval.proxy.train_dialogues
    if n is not None and n < len(free):
        free = random.Random(cfg.run.seed).sample(free, n)
    if len(free) < 2:
        raise UserError(f"only {len(free)} ESConv train dialogue(s) are outside the training RM's "
                        f"{len(exclude)}: train that RM on fewer dialogues to leave some for the proxy")
    return set(free)


def train_proxy_rm(cfg: Config, out: str | Path, log_fn=print) -> dict:
    """Silver pairs from train dialogues disjoint from the training RM's -> a reward head in ``out``,
    plus ``proxy.json`` recording the dialogue set; the held-out check runs on the result."""
    from escrag.pairs import silver_pairs, write_pairs
    from reward_server.train import train_reward_model

    out, training = Path(out), training_rm_dir(cfg)
    exclude = rm_dialogues(training)
    chosen = proxy_dialogue_set(cfg, exclude)
    pairs = silver_pairs(cfg, dialogues=chosen)
    log_fn(f"[proxy-rm] {len(pairs)} silver pairs from {len(chosen)} train dialogues outside the "
           f"{len(exclude)} of {training}")
    write_pairs(pairs, out / "pairs.jsonl")
    metrics = train_reward_model(cfg, out / "pairs.jsonl", out, log=log_fn)
    counts = check_held_out(rm_dialogues(out), exclude)
    write_json(out / "proxy.json", {"label": LABEL, "training_rm": str(training), **counts,
                                    "dialogue_ids": sorted(rm_dialogues(out)), "seed": cfg.run.seed})
    return {**metrics, **counts}


def proxy_rm_main(args) -> int:
    """``escrag eval proxy-rm --config FILE --out DIR``."""
    from escrag.config import load_config

    cfg = load_config(args.config, args.override)
    m = train_proxy_rm(cfg, args.out)
    print(f"proxy RM in {args.out}: {m['proxy_dialogues']} train dialogues, none of the training RM's "
          f"{m['training_dialogues']}; held-out pairwise accuracy {m['heldout_accuracy']:.3f}. "
          f"Set eval.proxy.rm_dir: {args.out}")
    return 0
