"""The judge's tables and figure: Table 1, Table 2 and Figure 3 of the paper, from per-state scores.

Owns: ``score_rows`` (per-system means and
intervals of the seven metrics and their average), the Markdown and CSV writers in the layouts of
Table 1 (systems x metrics grouped by perspective, plus Avg) and Table 2 (named rows with the change
of Avg against the first row), and the Figure 3 plot (each metric and the average against k).

Intervals (``escrag.stats.bootstrap_ci``): a state is the unit; the states of a system's valid judgments are resampled with
replacement ``eval.bootstrap`` times (seeded by ``run.seed``) and the interval is the central
``eval.ci`` share of the resampled means. A state's average is the mean of its seven scores; the Avg
column is the mean of those. Judgments that stayed malformed are left out and counted in the table.
"""

from __future__ import annotations

import csv
import io

import numpy as np

from escrag.atomic import atomic_file, write_text
from escrag.pairs import METRIC_NAMES, METRICS, PERSPECTIVES
from escrag.stats import bootstrap_ci

COLUMNS = (*METRICS, "Avg")


def score_matrix(records: list[dict]) -> np.ndarray:
    """[n, 8]: the seven scores and their average for each validly judged record."""
    rows = [[r["judge"]["scores"][m] for m in METRICS] for r in records
            if r.get("judge") and r["judge"].get("valid")]
    x = np.asarray(rows, dtype=np.float64).reshape(-1, len(METRICS))
    return np.concatenate([x, x.mean(axis=1, keepdims=True)], axis=1) if len(x) else np.zeros((0, 8))


def score_rows(per_state: list[dict], systems: list[tuple[str, str]], resamples: int, ci: float,
               seed: int) -> list[dict]:
    """One row per (name, label): n, malformed, unjudged and (mean, lo, hi) per column."""
    rows = []
    for name, label in systems:
        recs = [r for r in per_state if r["system"] == name]
        x = score_matrix(recs)
        judged = [r for r in recs if r.get("judge")]
        row = {"system": name, "label": label, "n": int(x.shape[0]),
               "malformed": sum(not r["judge"]["valid"] for r in judged),
               "unjudged": len(recs) - len(judged)}
        for j, col in enumerate(COLUMNS):
            row[col] = bootstrap_ci(x[:, j], resamples, ci, seed)
        rows.append(row)
    return rows


def _cell(v: tuple[float, float, float]) -> str:
    mean, lo, hi = v
    return "n/a" if np.isnan(mean) else f"{mean:.2f} [{lo:.2f}, {hi:.2f}]"


def _header() -> str:
    cols = []
    for group, metrics in PERSPECTIVES.items():
        cols += [f"{group}: {metrics[0]}", *metrics[1:]]
    return "| System | " + " | ".join(cols) + " | Avg | n | malformed |"


def table1_markdown(rows: list[dict], title: str, notes: list[str]) -> str:
    lines = [f"# {title}", "", *notes, "", _header(), "|" + " --- |" * (len(COLUMNS) + 3)]
    for r in rows:
        cells = [_cell(r[c]) for c in COLUMNS]
        lines.append(f"| {r['label']} | " + " | ".join(cells) + f" | {r['n']} | {r['malformed']} |")
    legend = ", ".join(f"{k} {v}" for k, v in METRIC_NAMES.items())
    lines += ["", f"Cells: mean [95% bootstrap interval] over states. Metrics: {legend}."]
    return "\n".join(lines) + "\n"


def table2_markdown(rows: list[dict], title: str, notes: list[str]) -> str:
    """Table 2: named rows in order, Avg with its change against the first row."""
    lines = [f"# {title}", "", *notes, "", _header().replace("| n |", "| Δ Avg | n |"),
             "|" + " --- |" * (len(COLUMNS) + 4)]
    base = rows[0]["Avg"][0] if rows else float("nan")
    for i, r in enumerate(rows):
        cells = [_cell(r[c]) for c in COLUMNS]
        delta = "" if i == 0 or np.isnan(r["Avg"][0]) else f"{r['Avg'][0] - base:+.2f}"
        lines.append(f"| {r['label']} | " + " | ".join(cells) + f" | {delta} | {r['n']} | {r['malformed']} |")
    return "\n".join(lines) + "\n"


def rows_csv(rows: list[dict]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["system", "label", "n", "malformed", "unjudged",
                *[f"{c}{s}" for c in COLUMNS for s in ("", "_lo", "_hi")]])
    for r in rows:
        w.writerow([r["system"], r["label"], r["n"], r["malformed"], r["unjudged"],
                    *[f"{v:.4f}" for c in COLUMNS for v in r[c]]])
    return buf.getvalue()


def write_table(path_stem, markdown: str, rows: list[dict]) -> list[str]:
    md, csv_path = f"{path_stem}.md", f"{path_stem}.csv"
    write_text(md, markdown)
    write_text(csv_path, rows_csv(rows))
    return [md, csv_path]


def figure3(rows: list[dict], ks: list[int], path, title: str) -> str:
    """Each metric's mean (thin lines) and the average with its interval (thick) against k."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    order = np.argsort(ks)
    k = np.asarray(ks)[order]
    fig, ax = plt.subplots(figsize=(6.4, 4.8))
    for m in METRICS:
        ax.plot(k, [rows[i][m][0] for i in order], marker="o", linewidth=1, label=m)
    avg = np.asarray([rows[i]["Avg"] for i in order])
    ax.errorbar(k, avg[:, 0], yerr=[avg[:, 0] - avg[:, 1], avg[:, 2] - avg[:, 0]], color="black",
                marker="s", linewidth=2.5, capsize=4, label="Avg (95% CI)")
    ax.set_xticks(k)
    ax.set_xlabel("retrieved exemplars k")
    ax.set_ylabel("judge score (1-10)")
    ax.set_title(title, fontsize=10)
    ax.legend(ncol=4, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14))
    ax.grid(alpha=0.3)
    fig.tight_layout()
    with atomic_file(path, "wb") as fh:
        fig.savefig(fh, format="png", dpi=120)
    plt.close(fig)
    return str(path)
