"""The retriever and reward servers a job needs: use given URLs, or start them as child processes.

Owns: ``ServerProcess`` (``python -m escrag serve ...`` on a free loopback port, log to a file, wait
for ``/health``, stop by pid) and ``job_services`` (a context manager yielding (retriever_url,
reward_url) and stopping only the servers it started, also on error). Servers get the job's resolved
config file so their numbers match the job's.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from escrag.errors import UserError


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(self, name: str, args: list[str], log_dir: Path, timeout: float):
        self.name, self.port = name, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = Path(log_dir) / f"{name}.log"
        self.log.parent.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "escrag", "serve", *args, "--port", str(self.port)]
        with self.log.open("w") as fh:
            self.proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=dict(os.environ))
        self._wait(timeout)

    def _wait(self, timeout: float) -> None:
        import httpx

        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} server exited with {self.proc.returncode}; "
                                   f"log {self.log}:\n{self.log.read_text()[-3000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"{self.name} server not healthy after {timeout:.0f} s; log {self.log}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _require(path: Path, what: str, how: str) -> str:
    if not path.exists():
        raise UserError(f"{path}: no {what}; {how}")
    return str(path)


def retriever_args(cfg, config_file: Path) -> list[str]:
    index = Path(cfg.retriever.index_dir or Path(cfg.run.output_dir) / "index")
    _require(index, "retriever index", "build it with `escrag index build` or set retriever.url")
    return ["retriever", "--index", str(index), "--config", str(config_file)]


def reward_args(cfg, config_file: Path) -> list[str]:
    rule = getattr(cfg.reward, "rule", None)
    if rule:
        return ["reward", "--rule", rule, "--config", str(config_file)]
    head = Path(cfg.reward.head_dir or Path(cfg.run.output_dir) / "rm")
    _require(head, "reward model", "train it with `escrag rm train` or set reward.url")
    return ["reward", "--rm", str(head), "--config", str(config_file)]


@contextlib.contextmanager
def job_services(cfg, config_file: Path, log_dir: Path, need_retriever: bool, log=print):
    """Yield (retriever_url or None, reward_url); servers started here are stopped on exit."""
    started: list[ServerProcess] = []
    try:
        urls = {}
        for name, needed, url, make in (("retriever", need_retriever, cfg.retriever.url, retriever_args),
                                        ("reward", True, cfg.reward.url, reward_args)):
            if not needed:
                urls[name] = None
            elif url:
                urls[name] = url
            else:
                args = make(cfg, config_file)
                log(f"[job] starting {name} server: escrag serve {' '.join(args)}")
                started.append(ServerProcess(name, args, log_dir, cfg.run.server_timeout_s))
                urls[name] = started[-1].url
                log(f"[job] {name} server up at {urls[name]} (pid {started[-1].proc.pid})")
        yield urls["retriever"], urls["reward"]
    finally:
        for server in reversed(started):
            server.stop()
