"""escrag.progress: a tqdm bar on a terminal, a line every 10% or 30 s elsewhere; and a real call site
(escrag.embed's loop on the packaged MiniLM, in a subprocess whose stderr is a pipe) writes few lines.

Run: .venv/bin/python -m pytest -q tests/test_progress.py"""

from __future__ import annotations

import io
import re
import subprocess
import sys
from pathlib import Path

import pytest

from escrag.progress import LogProgress, progress_bar

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parent.parent
LINE = re.compile(r"^\w[\w ]*: \d+(/\d+ \(\d+%\))? [\d.]+ (\w+/s|s/\w+), [\d:]+ elapsed, ~[\d:?]+ left")


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_log_gets_a_line_per_tenth_with_rate_and_time_left():
    out, clock = io.StringIO(), Clock()
    with progress_bar(total=1000, desc="work", unit="item", file=out, clock=clock) as bar:
        for _ in range(1000):
            clock.t += 0.01
            bar.update(1)
            bar.set_postfix(loss="0.5", refresh=False)
    lines = out.getvalue().splitlines()
    assert 9 <= len(lines) <= 11 and "\r" not in out.getvalue()
    assert all(LINE.match(x) for x in lines), lines
    assert lines[0].startswith("work: 100/1000 (10%) 100.0 item/s, 00:01 elapsed, ~00:09 left, loss=0.5")
    assert lines[-1].startswith("work: 1000/1000 (100%)")


def test_iterating_with_initial_counts_the_rate_from_where_it_resumed():
    out, clock = io.StringIO(), Clock()
    bar = progress_bar(range(50, 100), desc="grpo", unit="step", file=out, clock=clock, initial=50, total=100)
    for _ in bar:
        clock.t += 2.0
    lines = out.getvalue().splitlines()
    assert len(lines) == 5 and lines[0].startswith("grpo: 60/100 (60%) 2.0 s/step, 00:20 elapsed, ~01:20 left")


def test_a_30_second_gap_forces_a_line_and_no_total_prints_only_by_time():
    out, clock = io.StringIO(), Clock()
    bar = LogProgress(total=1000, desc="slow", file=out, clock=clock)
    bar.update(1)
    assert out.getvalue() == ""
    clock.t = 31.0
    bar.update(1)
    assert out.getvalue().startswith("slow: 2/1000 (0%)")
    out2 = io.StringIO()
    bar = LogProgress(desc="open", unit="row", file=out2, clock=clock)
    for _ in range(500):
        bar.update(1)
    clock.t += 30
    bar.update(1)
    bar.close()
    assert out2.getvalue().splitlines()[0].startswith("open: 501 ") and len(out2.getvalue().splitlines()) == 1


def test_a_terminal_gets_a_tqdm_bar_and_disable_prints_nothing():
    tty = Tty()
    with progress_bar(total=10, desc="bar", file=tty) as bar:
        bar.update(10)
    assert "\r" in tty.getvalue() and "|" in tty.getvalue()
    quiet = io.StringIO()
    assert list(progress_bar(range(3), desc="x", file=quiet, disable=True)) == [0, 1, 2]
    assert quiet.getvalue() == ""


def test_the_embedding_loop_writes_few_lines_to_a_pipe():
    code = ("from escrag.embed import load_embedder\n"
            "load_embedder('packaged:minilm').encode([f'text {i}' for i in range(150)], batch_size=1, progress=True)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, check=True)
    lines = [x for x in re.split(r"[\r\n]", proc.stderr) if x.startswith("embedding")]
    assert 1 <= len(lines) <= 12, lines
    assert lines[-1].startswith("embedding: 150/150 (100%)")
