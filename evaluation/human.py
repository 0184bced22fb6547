"""The blind pairwise human study (paper 4.4, Appendix E, Figure 4): export, annotation form, import.

Owns: ``export_human`` (``escrag eval export-human --run DIR --out DIR``), the self-contained HTML
form, ``import_human`` (``escrag eval import-human --run DIR FILES...``), ``fleiss_kappa`` and the
Figure 4 plot.

Export: ``eval.human.contexts`` states are drawn (seeded by ``run.seed``) from the run's states where
the system under study (``eval.human.system``, default the first system) and every baseline
(``eval.human.baselines``, default all other systems) answered. Each (state, baseline) is a pair whose
A/B order is a seeded coin flip, and the pairs are shuffled. ``--out`` gets ``pairs.csv`` (pair id,
context, response A, response B: no system names) and ``form.html`` (the pairs embedded, no network);
the key (pair id -> state, system A, system B) is written apart, to ``<run>/human/key.csv``, and never
goes to annotators. The form saves the annotator's name and an A / B / tie choice per pair as a JSON
file the browser downloads (``annotations-<name>.json``); it keeps unsaved choices in the browser's
local storage. A filled copy of ``pairs.csv`` with a ``choice`` column (and ``annotator``, else the
file name) is accepted as well.

Import: choices are mapped through the key to the system under study's win / tie / loss. Per
comparison, an item's outcome is the one a strict majority of its annotators chose, else a tie (one
annotator: that annotator's choice). Agreement is Fleiss' kappa over the items every annotator
rated, categories win / tie / loss (undefined with fewer than two annotators or when every rating
falls in one category). Writes ``<run>/human/results.json``, ``human.md`` and ``figure4.png``.

Departure from the paper: its annotators scored both responses on the seven criteria and the higher
overall score decided; here they choose directly (A, B or tie), with the criteria shown on the form.
"""

from __future__ import annotations

import csv
import html
import io
import json
import math
import random
from collections import Counter
from pathlib import Path

from escrag.atomic import atomic_file, write_json, write_text
from escrag.cache import content_key
from escrag.config import load_config
from escrag.data import read_jsonl
from escrag.errors import UserError
from escrag.pairs import METRIC_NAMES
from escrag.prompts import transcript
from evaluation.states import read_states

CHOICES = ("A", "B", "tie")
OUTCOMES = ("win", "tie", "loss")
KEY_FIELDS = ("pair_id", "state_id", "system_a", "system_b", "study", "form_id")


# ----------------------------------------------------------------------------- export


def _study(cfg, per_state: list[dict]) -> tuple[str, list[str]]:
    names = [s.name for s in cfg.eval.systems]
    study = cfg.eval.human.system or names[0]
    baselines = cfg.eval.human.baselines or [n for n in names if n != study]
    if not baselines:
        raise UserError("eval.human.baselines: the human study needs at least two systems")
    return study, baselines


def build_pairs(cfg, per_state: list[dict], states: dict) -> list[dict]:
    """The shuffled blind pairs: pair id, state, context, A and B with their systems."""
    study, baselines = _study(cfg, per_state)
    answers = {(r["state_id"], r["system"]): r["response"] for r in per_state}
    eligible = [sid for sid in states if all((sid, s) in answers for s in (study, *baselines))]
    if not eligible:
        raise UserError(f"no state has answers from {study} and every baseline ({', '.join(baselines)})")
    rng = random.Random(cfg.run.seed)
    chosen = sorted(rng.sample(eligible, min(cfg.eval.human.contexts, len(eligible))))
    pairs = []
    for sid in chosen:
        for base in baselines:
            a, b = (study, base) if rng.random() < 0.5 else (base, study)
            pairs.append({"state_id": sid, "context": transcript(states[sid]["history"]),
                          "system_a": a, "system_b": b, "study": study,
                          "response_a": answers[(sid, a)], "response_b": answers[(sid, b)]})
    rng.shuffle(pairs)
    for i, p in enumerate(pairs, 1):
        p["pair_id"] = f"p{i:04d}"
    return pairs


def _csv(rows: list[dict], fields: tuple) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(fields), extrasaction="ignore")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def export_human(run_dir: str | Path, out_dir: str | Path) -> dict:
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    per_state_path = run_dir / "per_state.jsonl"
    if not per_state_path.is_file():
        raise UserError(f"{run_dir}: no per_state.jsonl (run `escrag eval --config FILE` first)")
    cfg = load_config(run_dir / "config.yaml")
    per_state = [obj for _, _, obj in read_jsonl(per_state_path, "per-state results file")]
    pairs = build_pairs(cfg, per_state, read_states(run_dir / "states.jsonl"))
    form_id = content_key([[p["pair_id"], p["context"], p["response_a"], p["response_b"]] for p in pairs])[:16]
    for p in pairs:
        p["form_id"] = form_id
    write_text(out_dir / "pairs.csv", _csv(pairs, ("pair_id", "context", "response_a", "response_b")))
    write_text(out_dir / "form.html", form_html(pairs, form_id))
    write_text(run_dir / "human" / "key.csv", _csv(pairs, KEY_FIELDS))
    return {"pairs": len(pairs), "form_id": form_id, "out": str(out_dir), "key": str(run_dir / "human" / "key.csv")}


def form_html(pairs: list[dict], form_id: str) -> str:
    """The annotation form: one file, its data embedded, no network access."""
    data = json.dumps({"form_id": form_id, "pairs": [{k: p[k] for k in ("pair_id", "context", "response_a",
                                                                         "response_b")} for p in pairs]})
    data = data.replace("</", "<\\/")  # keep "</script>" inside a response from closing the data block
    criteria = "".join(f"<li><b>{k}</b> {html.escape(v)}</li>" for k, v in METRIC_NAMES.items())
    return (_FORM.replace("__DATA__", data).replace("__CRITERIA__", criteria)
            .replace("__N__", str(len(pairs))))


_FORM = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'">
<title>escrag-r1 blind pairwise evaluation</title>
<style>
body{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;line-height:1.45}
.pair{border:1px solid #bbb;border-radius:6px;padding:1rem;margin:1.2rem 0}
.ctx{white-space:pre-wrap;background:#f4f4f4;padding:.6rem;border-radius:4px;font-size:.92rem}
.resp{display:grid;grid-template-columns:1fr 1fr;gap:1rem;margin:.8rem 0}
.resp div{white-space:pre-wrap;border:1px solid #ddd;padding:.6rem;border-radius:4px}
.bar{position:sticky;top:0;background:#fff;padding:.6rem 0;border-bottom:1px solid #ccc}
label{margin-right:1.2rem}
</style></head><body>
<h1>Which counselor reply is better?</h1>
<p>For each conversation, read the two replies to the client's last message and choose the better one,
or <i>tie</i> when neither is better. The replies come from different systems in a random order.
Judge them as the client, as a supervising counselor, and as an impartial judge:</p>
<ul>__CRITERIA__</ul>
<div class="bar">Your name: <input id="annotator" autocomplete="off">
<button id="save">Save choices</button> <span id="status">0 / __N__ answered</span></div>
<div id="pairs"></div>
<script type="application/json" id="data">__DATA__</script>
<script>
const DATA = JSON.parse(document.getElementById('data').textContent);
const store = 'escrag-human-' + DATA.form_id;
const saved = JSON.parse(localStorage.getItem(store) || '{}');
const choices = saved.choices || {};
const root = document.getElementById('pairs');
function el(tag, cls, text) { const e = document.createElement(tag); if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text; return e; }
DATA.pairs.forEach((p, i) => {
  const box = el('div', 'pair'); box.id = 'pair-' + p.pair_id;
  box.appendChild(el('h3', '', (i + 1) + '. ' + p.pair_id));
  box.appendChild(el('div', 'ctx', p.context));
  const resp = el('div', 'resp');
  resp.appendChild(el('div', '', 'A: ' + p.response_a)); resp.appendChild(el('div', '', 'B: ' + p.response_b));
  box.appendChild(resp);
  ['A', 'B', 'tie'].forEach(c => {
    const lab = el('label'); const inp = document.createElement('input');
    inp.type = 'radio'; inp.name = p.pair_id; inp.value = c; inp.checked = choices[p.pair_id] === c;
    inp.addEventListener('change', () => { choices[p.pair_id] = c; remember(); });
    lab.appendChild(inp); lab.appendChild(document.createTextNode(' ' + (c === 'tie' ? 'tie' : c + ' is better')));
    box.appendChild(lab);
  });
  root.appendChild(box);
});
const name = document.getElementById('annotator'); name.value = saved.annotator || '';
name.addEventListener('input', remember);
function remember() {
  localStorage.setItem(store, JSON.stringify({annotator: name.value, choices: choices}));
  document.getElementById('status').textContent = Object.keys(choices).length + ' / ' + DATA.pairs.length + ' answered';
}
remember();
document.getElementById('save').addEventListener('click', () => {
  const who = name.value.trim();
  if (!who) { document.getElementById('status').textContent = 'enter your name first'; return; }
  const out = {form_id: DATA.form_id, annotator: who, saved_at: new Date().toISOString(), choices: choices};
  const blob = new Blob([JSON.stringify(out, null, 1)], {type: 'application/json'});
  const a = document.createElement('a'); a.href = URL.createObjectURL(blob);
  a.download = 'annotations-' + who.replace(/[^A-Za-z0-9_-]+/g, '_') + '.json';
  document.body.appendChild(a); a.click(); a.remove();
  document.getElementById('status').textContent = 'saved ' + Object.keys(choices).length + ' / ' + DATA.pairs.length;
});
</script></body></html>
"""


def export_main(args) -> int:
    out = export_human(args.run, args.out)
    print(f"{out['pairs']} blind pairs -> {out['out']}/pairs.csv and form.html (form {out['form_id']}); "
          f"the key is apart in {out['key']}: do not send it to annotators")
    return 0


# ----------------------------------------------------------------------------- import


def read_key(run_dir: Path) -> dict[str, dict]:
    path = run_dir / "human" / "key.csv"
    if not path.is_file():
        raise UserError(f"{path}: no key (run `escrag eval export-human --run {run_dir} --out DIR` first)")
    with path.open(newline="", encoding="utf-8") as fh:
        return {row["pair_id"]: row for row in csv.DictReader(fh)}


def _read_json(path: Path, form_id: str) -> tuple[str, dict]:
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: not a JSON annotation file ({exc})") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("choices"), dict):
        raise UserError(f"{path}: expected an object with 'annotator' and 'choices'")
    if obj.get("form_id") != form_id:
        raise UserError(f"{path}: saved from form {obj.get('form_id')!r}, but this run's key is for form "
                        f"{form_id!r} (an older export?)")
    return str(obj.get("annotator", "")).strip(), obj["choices"]


CSV_FIELDS = ("pair_id", "context", "response_a", "response_b", "choice")  # pairs.csv + the choice column


def _csv_rows(path: Path) -> list[dict]:
    """The rows of a filled pairs.csv; a short or long row, a missing column or a pair listed twice
    is an error naming its line."""
    with path.open(newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in CSV_FIELDS if c not in (reader.fieldnames or [])]
        if missing:
            raise UserError(f"{path}: a filled CSV is the exported pairs.csv with a choice column; missing "
                            f"{', '.join(missing)}")
        rows, seen = [], set()
        for row in reader:
            line = reader.line_num
            if None in row or None in row.values():
                raise UserError(f"{path}: line {line} has {'more' if None in row else 'fewer'} cells than the header")
            if row["pair_id"] in seen:
                raise UserError(f"{path}: line {line}: pair {row['pair_id']!r} appears twice")
            seen.add(row["pair_id"])
            rows.append(row)
    return rows


def _read_csv(path: Path, key: dict) -> tuple[str, dict]:
    """Like the JSON path, a CSV must come from this run's form: its pairs (ids and texts, in the key's
    order) hash to the key's form id."""
    rows = {r["pair_id"]: r for r in _csv_rows(path)}
    form_id = next(iter(key.values()))["form_id"] if key else ""
    unknown = sorted(set(rows) - set(key))
    if unknown:
        raise UserError(f"{path}: pair {unknown[0]!r} is not in this run's key")
    if len(rows) != len(key):
        raise UserError(f"{path}: holds {len(rows)} of the form's {len(key)} pairs (keep every row; leave a "
                        f"choice empty to skip it)")
    texts = [[pid] + [rows[pid][c].replace("\r\n", "\n") for c in CSV_FIELDS[1:4]] for pid in key]
    if content_key(texts)[:16] != form_id:
        raise UserError(f"{path}: its pairs are not those of this run's form {form_id!r} (a CSV from another "
                        f"export, or edited texts)")
    names = {r.get("annotator", "").strip() for r in rows.values()} - {""}
    if len(names) > 1:
        raise UserError(f"{path}: one annotator per file, found {', '.join(sorted(names))}")
    choices = {pid: r["choice"].strip() for pid, r in rows.items() if r["choice"].strip()}
    return (names.pop() if names else path.stem), choices


def read_annotations(files: list[str | Path], key: dict) -> dict[str, dict[str, str]]:
    """annotator -> {pair id -> A | B | tie}; every problem names its file."""
    form_id = next(iter(key.values()))["form_id"] if key else ""
    out: dict[str, dict[str, str]] = {}
    for f in map(Path, files):
        if not f.is_file():
            raise UserError(f"{f}: no such annotation file")
        who, choices = _read_csv(f, key) if f.suffix.lower() == ".csv" else _read_json(f, form_id)
        if not who:
            raise UserError(f"{f}: no annotator name")
        if who in out:
            raise UserError(f"{f}: annotator {who!r} appears in two files")
        for pid, c in choices.items():
            if pid not in key:
                raise UserError(f"{f}: pair {pid!r} is not in this run's key")
            if c not in CHOICES:
                raise UserError(f"{f}: pair {pid}: choice must be one of {', '.join(CHOICES)}, got {c!r}")
        out[who] = dict(choices)
    return out


def outcome(choice: str, row: dict) -> str:
    """The system under study's outcome for one choice."""
    if choice == "tie":
        return "tie"
    winner = row["system_a"] if choice == "A" else row["system_b"]
    return "win" if winner == row["study"] else "loss"


def majority(outcomes: list[str]) -> str:
    top, n = Counter(outcomes).most_common(1)[0]
    return top if n * 2 > len(outcomes) else "tie"


def fleiss_kappa(counts: list[list[int]]) -> float:
    """Fleiss' kappa. counts[i][j]: raters who put item i in category j; every item has the same
    number of raters n >= 2. NaN when every rating falls in one category (kappa undefined)."""
    if not counts:
        return float("nan")
    n = sum(counts[0])
    if n < 2 or any(sum(row) != n for row in counts):
        raise ValueError("every item needs the same number (>= 2) of ratings")
    total = len(counts) * n
    p = [sum(row[j] for row in counts) / total for j in range(len(counts[0]))]
    p_bar = sum((sum(c * c for c in row) - n) / (n * (n - 1)) for row in counts) / len(counts)
    p_e = sum(x * x for x in p)
    return float("nan") if p_e == 1.0 else (p_bar - p_e) / (1 - p_e)


def summarise(annotations: dict, key: dict) -> dict:
    """Per comparison: majority win/tie/loss, per-annotator counts, Fleiss' kappa."""
    comparisons: dict[str, dict] = {}
    for pid, row in key.items():
        base = row["system_b"] if row["system_a"] == row["study"] else row["system_a"]
        comp = comparisons.setdefault(base, {"study": row["study"], "baseline": base, "items": {}})
        votes = [outcome(a[pid], row) for a in annotations.values() if pid in a]
        if votes:
            comp["items"][pid] = votes
    everyone = len(annotations)
    out = []
    for comp in comparisons.values():
        items = comp.pop("items")
        maj = Counter(majority(v) for v in items.values())
        full = [v for v in items.values() if len(v) == everyone]
        out.append({**comp, "pairs": len(items), **{o: maj.get(o, 0) for o in OUTCOMES},
                    "kappa": _kappa(full, everyone), "kappa_items": len(full) if everyone >= 2 else 0})
    all_full = [[outcome(a[pid], row) for a in annotations.values()] for pid, row in key.items()
                if all(pid in a for a in annotations.values())]
    return {"annotators": sorted(annotations), "comparisons": out, "kappa_overall": _kappa(all_full, everyone)}


def _kappa(votes: list[list[str]], raters: int) -> float | None:
    """Fleiss' kappa of outcome lists, rounded; None when undefined."""
    if raters < 2 or not votes:
        return None
    k = fleiss_kappa([[v.count(o) for o in OUTCOMES] for v in votes])
    return None if math.isnan(k) else round(k, 4)


def figure4(comparisons: list[dict], path: Path) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 0.8 + 0.7 * len(comparisons)))
    labels = [f"{c['study']} vs {c['baseline']}" + ("" if c["kappa"] is None else f"\n(Fleiss' κ {c['kappa']:.2f})")
              for c in comparisons]
    left = [0.0] * len(comparisons)
    for o, color in zip(OUTCOMES, ("#4c9a5b", "#b9b9b9", "#c8553d")):
        vals = [100 * c[o] / max(1, c["pairs"]) for c in comparisons]
        bars = ax.barh(labels, vals, left=left, color=color, label=o)
        for bar, c in zip(bars, comparisons):
            if c[o]:
                ax.text(bar.get_x() + bar.get_width() / 2, bar.get_y() + bar.get_height() / 2, str(c[o]),
                        ha="center", va="center", fontsize=9)
        left = [a + b for a, b in zip(left, vals)]
    ax.set_xlim(0, 100)
    ax.set_xlabel("% of pairs (majority of annotators)")
    ax.invert_yaxis()
    ax.legend(ncol=3, loc="lower center", bbox_to_anchor=(0.5, 1.0), fontsize=9)
    fig.tight_layout()
    with atomic_file(path, "wb") as fh:
        fig.savefig(fh, format="png", dpi=120)
    plt.close(fig)
    return str(path)


def human_markdown(res: dict) -> str:
    lines = ["# Human evaluation: blind pairwise comparison", "",
             f"Annotators: {', '.join(res['annotators'])}. Outcome per pair: the majority of annotators, "
             "else a tie. Agreement: Fleiss' kappa over pairs every annotator rated.", "",
             "| comparison | win | tie | loss | pairs | Fleiss' kappa |", "| --- | --- | --- | --- | --- | --- |"]
    for c in res["comparisons"]:
        kappa = "n/a" if c["kappa"] is None else f"{c['kappa']:.3f}"
        lines.append(f"| {c['study']} vs {c['baseline']} | {c['win']} | {c['tie']} | {c['loss']} | "
                     f"{c['pairs']} | {kappa} |")
    overall = "n/a" if res["kappa_overall"] is None else f"{res['kappa_overall']:.3f}"
    return "\n".join(lines + ["", f"Fleiss' kappa over all pairs: {overall}."]) + "\n"


def import_human(run_dir: str | Path, files: list) -> dict:
    run_dir = Path(run_dir)
    key = read_key(run_dir)
    res = summarise(read_annotations(files, key), key)
    out = run_dir / "human"
    write_json(out / "results.json", res)
    write_text(out / "human.md", human_markdown(res))
    res["figure"] = figure4(res["comparisons"], out / "figure4.png")
    return res


def import_main(args) -> int:
    res = import_human(args.run, args.files)
    for c in res["comparisons"]:
        print(f"{c['study']} vs {c['baseline']}: {c['win']} win / {c['tie']} tie / {c['loss']} loss "
              f"over {c['pairs']} pairs; Fleiss' kappa {c['kappa'] if c['kappa'] is not None else 'n/a'}")
    print(f"written {Path(args.run) / 'human'}/results.json, human.md, figure4.png")
    return 0

