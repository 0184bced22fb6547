"""Per-step training logs: JSONL files, TensorBoard scalars and the final PNG of reward and KL.

Owns: ``StepLog`` (append one JSON object per line, each with a ``step``; on resume, lines past the
checkpoint's step are dropped so the file reads as one uninterrupted run), ``MetricsLog`` (the step
metrics in ``metrics.jsonl``, mirrored to TensorBoard), and ``plot_curves``. The job also keeps
``samples.jsonl`` (every sampled output, its reward and exemplars) through a ``StepLog``. A step's row
carries its validation's metrics (``eval/...``) when it had one; TensorBoard shows them under ``eval/``,
the rest under ``train/``.
"""

from __future__ import annotations

import json
from pathlib import Path

from escrag.atomic import atomic_file, write_text


class StepLog:
    def __init__(self, path: str | Path, resume_step: int | None = None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is None:
            write_text(self.path, "")
        else:
            rows = read_metrics(self.path) if self.path.exists() else []
            write_text(self.path, "".join(json.dumps(r) + "\n" for r in rows if r["step"] <= resume_step))

    def write(self, row: dict) -> None:
        with self.path.open("a") as fh:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")


class MetricsLog(StepLog):
    def __init__(self, out_dir: str | Path, resume_step: int | None = None, tensorboard: bool = True):
        super().__init__(Path(out_dir) / "metrics.jsonl", resume_step)
        self.tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(Path(out_dir) / "tensorboard"))

    def write(self, row: dict) -> None:
        super().write(row)
        if self.tb is not None:
            for key, value in row.items():
                if isinstance(value, (int, float)) and key != "step":  # eval/... keep their prefix
                    self.tb.add_scalar(key if "/" in key else f"train/{key}", value, row["step"])
            self.tb.flush()

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


def read_metrics(path: str | Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


RUNNING_WINDOW = 8  # steps in the plotted running mean: each step sees only a few states, so it is noisy


def running_mean(values: list[float], window: int) -> list[float]:
    """Trailing mean over the last ``window`` values (fewer at the start)."""
    out = []
    for i in range(len(values)):
        part = values[max(0, i - window + 1):i + 1]
        out.append(sum(part) / len(part))
    return out


def plot_curves(rows: list[dict], out: str | Path) -> Path:
    """Reward mean (± std) per step with its running mean, and KL per step, written atomically as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out)
    steps = [r["step"] for r in rows]
    mean = [r.get("reward_mean", float("nan")) for r in rows]
    std = [r.get("reward_std", 0.0) for r in rows]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
    ax1.plot(steps, mean, marker=".", lw=0.8, alpha=0.5, label="reward mean (step)")
    ax1.fill_between(steps, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)], alpha=0.15)
    window = max(1, min(RUNNING_WINDOW, len(mean)))
    ax1.plot(steps, running_mean(mean, window), lw=2.2, color="tab:blue", label=f"running mean ({window} steps)")
    ax1.plot(steps, [r.get("format_mean", float("nan")) for r in rows], ls="--", label="format part")
    ax1.set_xlabel("step")
    ax1.set_title("reward")
    ax1.legend()
    ax2.plot(steps, [r.get("kl", float("nan")) for r in rows], marker="o", color="tab:red")
    ax2.set_xlabel("step")
    ax2.set_title("KL to reference (k3)")
    fig.tight_layout()
    with atomic_file(out, "wb") as fh:
        fig.savefig(fh, dpi=100, format="png")
    plt.close(fig)
    return out
