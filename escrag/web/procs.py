"""Running the project's own HTTP services as child processes.

Owns: ``free_port`` and ``ServerProcess``: ``python -m escrag serve ...`` on a free loopback port, its
output in a log file, a wait for ``GET /health``, a restart on the same port, and a stop by pid
(terminate, then kill). Jobs,
benchmarks and tests all start servers through it, so each one ends exactly the processes it started.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from escrag.errors import ServiceError


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """``escrag serve <args> --port P``; with ``timeout`` the constructor waits for /health (a
    ``timeout`` of None returns at once: call ``wait`` later, e.g. after starting several).
    ``restart()`` starts the same command on the same port, so clients' URLs stay valid. ``env``:
    variables set for the process (and its restarts) over this one's, e.g. ``CUDA_VISIBLE_DEVICES``."""

    def __init__(self, name: str, args: list[str], log_dir: Path, timeout: float | None = 180.0,
                 port: int | None = None, env: dict[str, str] | None = None):
        self.name, self.args, self.port, self.env = name, list(args), port or free_port(), dict(env or {})
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = Path(log_dir) / f"{name}.log"
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.restarts = 0
        self._launch("w")
        if timeout is not None:
            self.wait(timeout)

    def _launch(self, mode: str) -> None:
        cmd = [sys.executable, "-m", "escrag", "serve", *self.args, "--port", str(self.port)]
        with self.log.open(mode) as fh:
            self.proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env={**os.environ, **self.env})

    def alive(self) -> bool:
        return self.proc.poll() is None

    def restart(self, timeout: float) -> ServerProcess:
        """Stop what is left of the process, start it again on the same port, wait for /health."""
        self.stop()
        self.restarts += 1
        with self.log.open("a") as fh:
            fh.write(f"\n--- restart {self.restarts} ---\n")
        self._launch("a")
        return self.wait(timeout)

    def wait(self, timeout: float) -> ServerProcess:
        import httpx

        deadline = time.time() + timeout
        with httpx.Client(timeout=2) as client:  # one client: each new one loads the CA store (~0.1 s of CPU)
            while time.time() < deadline:
                if self.proc.poll() is not None:
                    raise ServiceError(f"{self.name} server exited with {self.proc.returncode}; "
                                       f"log {self.log}:\n{self.log.read_text()[-3000:]}")
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(f"{self.url}/health").status_code == 200:
                        return self
                time.sleep(0.3)
        self.stop()
        raise ServiceError(f"{self.name} server not healthy after {timeout:.0f} s; log {self.log}:\n"
                           f"{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
