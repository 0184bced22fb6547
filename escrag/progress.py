"""Progress of long stages: a tqdm bar on a terminal, a few plain lines in a log.

Owns: ``progress_bar``, which the project's long loops call instead of ``tqdm(...)`` with the same
arguments (an iterable or ``total``, ``desc``, ``unit``, ``initial``, ``file``, ``disable``; the
handle has ``update``, ``set_postfix``, ``close`` and is a context manager and an iterable). Where
the stream is a terminal (its ``isatty()``) it is a tqdm bar. Elsewhere (a ``ray job submit`` log,
a Ray worker's output, CI, ``make demo | tee``), where tqdm would write every refresh, ``LogProgress``
writes one plain line ``desc: n/total (pct%) rate unit/s, elapsed, ~left, postfix`` once 10% more of
the total is done or 30 s have passed since the last line, whichever comes first (every 30 s with no
total), and a last line at close.
"""

from __future__ import annotations

import sys
import time

from tqdm import tqdm

EVERY_S = 30.0  # a line at least this often while updates come
EVERY_SHARE = 0.1  # and one each time this share more of the total is done


def progress_bar(iterable=None, *, file=None, disable: bool = False, clock=time.monotonic, **kwargs):
    """A tqdm bar on a terminal (or when disabled), else a ``LogProgress``; ``file`` defaults to stderr."""
    file = sys.stderr if file is None else file
    try:
        tty = file.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        tty = False
    if tty or disable:
        return tqdm(iterable, file=file, disable=disable, **kwargs)
    return LogProgress(iterable, file=file, clock=clock, **kwargs)


class LogProgress:
    """tqdm's interface as the project uses it, written as a few plain lines (module docstring)."""

    def __init__(self, iterable=None, total=None, desc=None, unit: str = "it", initial: int = 0, file=None,
                 clock=time.monotonic, **_tqdm_only):  # dynamic_ncols and the like mean nothing in a log
        if total is None and hasattr(iterable, "__len__"):
            total = len(iterable)
        self.iterable, self.total, self.desc, self.unit = iterable, total, desc, unit
        self.file = file or sys.stderr
        self.n = self.initial = self._last_n = initial
        self.clock, self.postfix, self.closed = clock, "", False
        self.start = self._last_t = clock()

    def __iter__(self):
        try:
            for item in self.iterable:
                yield item
                self.update(1)
        finally:
            self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def update(self, n: int = 1) -> None:
        self.n += n
        step = self.total * EVERY_SHARE if self.total else None
        if (step and self.n - self._last_n >= step) or self.clock() - self._last_t >= EVERY_S:
            self._line()

    def set_postfix(self, ordered_dict=None, refresh: bool = True, **kwargs) -> None:
        items = {**(ordered_dict or {}), **kwargs}
        self.postfix = ", ".join(f"{k}={v}" for k, v in items.items())

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.n != self._last_n or self.n == self.initial:
                self._line()

    def _line(self) -> None:
        now = self.clock()
        elapsed = now - self.start
        rate = (self.n - self.initial) / elapsed if elapsed > 0 else 0.0
        speed = f"{rate:.1f} {self.unit}/s" if rate >= 1 or not rate else f"{1 / rate:.1f} s/{self.unit}"
        if self.total:
            left = tqdm.format_interval((self.total - self.n) / rate) if rate else "?"
            done = f"{self.n}/{self.total} ({100 * self.n / self.total:.0f}%)"
        else:
            left, done = "?", str(self.n)
        parts = [f"{done} {speed}", f"{tqdm.format_interval(elapsed)} elapsed", f"~{left} left"]
        print(f"{self.desc or 'progress'}: " + ", ".join(parts + [self.postfix] * bool(self.postfix)),
              file=self.file, flush=True)
        self._last_n, self._last_t = self.n, now
