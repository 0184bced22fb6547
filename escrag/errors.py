"""The project's one error model, and the one entry helper every command and job runs through.

Owns: the exception classes whose message is the whole story for a person, and ``run_main``.

- ``EscragError``: the base. Its message names what is wrong and where; no traceback is needed.
- ``UserError``: input the user gave is wrong (a config, a data file, a model spec, a request body).
  Every entry point reports it as one line and exit 2; every server answers it with HTTP 400.
  ``escrag.config.ConfigError``, ``escrag.data.DataError`` and ``escrag.models.ModelSpecError`` are
  its subclasses.
- ``ServiceError``: a service the job depends on failed for good (down past its wait, or answering
  nonsense). Entry points report it as one line and exit 1; it is not the user's input.
- ``Overloaded``: a server's queue is full; servers answer 503 with ``Retry-After`` (``escrag.web.serving``).

``run_main(prog, fn)`` runs a job's body and turns these into a clean message and exit code; the
``escrag`` CLI and every ``python -m ray_jobs.<job>`` go through it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable


class EscragError(Exception):
    """An error whose message tells a person what is wrong; printed without a traceback."""

    exit_code = 1


class UserError(EscragError, ValueError):
    """Input the user gave is wrong: exit 2 from a command, HTTP 400 from a server."""

    exit_code = 2


class ServiceError(EscragError, RuntimeError):
    """A call to a service failed for good; the message names the URL."""


class Overloaded(EscragError, RuntimeError):
    """A server's queue is full; retry after ``retry_after`` seconds (HTTP 503)."""

    def __init__(self, message: str, retry_after: int = 1):
        super().__init__(message)
        self.retry_after = retry_after


class Terminated(BaseException):
    """SIGTERM reached a job (``run_main``): raised in its main thread so that what it started (servers,
    Ray, engines) is stopped by the ``with`` and ``finally`` blocks around it, as on Ctrl-C."""


def _terminate(signum, frame):
    raise Terminated


def run_main(prog: str, fn: Callable[[], int | None]) -> int:
    """Run ``fn`` and return its exit code; an ``EscragError`` prints ``prog: error: message`` and
    returns its exit code (2 for the user's input), Ctrl-C returns 130, SIGTERM 143 (both after the
    job's cleanup ran), a closed pipe 0. The process is tuned first (``escrag.runtime.tune_process``):
    every job, server and command runs through here."""
    import signal
    import threading

    from escrag.runtime import tune_process

    tune_process()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminate)  # a server's uvicorn installs its own over this one
    try:
        return int(fn() or 0)
    except EscragError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:  # output piped into `head`
        return 0
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Terminated:
        print(f"{prog}: terminated", file=sys.stderr)
        return 143
