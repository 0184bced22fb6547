"""The retriever and reward servers a job needs: use given URLs, or start them and keep them up.

Owns: ``JobServices`` (a context manager: ``with JobServices(...) as svc: svc.urls``) that starts the
servers a job needs as child processes unless ``retriever.url`` / ``reward.url`` are given (both
launched before either is waited for, so they load side by side), gives them
the job's resolved config file so their numbers match the job's, watches the ones it started and
restarts a dead one on the same port (so the workers' URLs stay valid and their clients' retries go
through once it is back: nothing is lost), counts the restarts for the job's metrics, and stops only
what it started, also on error. A server the placement plan puts on a GPU (``trainer.placement``) is
started with ``CUDA_VISIBLE_DEVICES`` naming that GPU (``gpu_env``), so it lands where the plan counted it.

A server the job did not start is not restarted: when it stays down, the clients give up after
``retriever.wait_s`` / ``reward.wait_s`` and the job stops with a clear message and a checkpoint
(``ray_jobs/train_grpo.py``).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from escrag.config import run_paths
from escrag.errors import ServiceError, UserError
from escrag.web.procs import ServerProcess


def _require(path: Path, what: str, how: str) -> str:
    if not path.exists():
        raise UserError(f"{path}: no {what}; {how}")
    return str(path)


def retriever_args(cfg, config_file: Path) -> list[str]:
    index = run_paths(cfg).index
    _require(index, "retriever index", "build it with `escrag index build` or set retriever.url")
    return ["retriever", "--index", str(index), "--config", str(config_file)]


def reward_args(cfg, config_file: Path) -> list[str]:
    if cfg.reward.rule:
        return ["reward", "--rule", cfg.reward.rule, "--config", str(config_file)]
    head = run_paths(cfg).rm
    _require(head, "reward model", "train it with `escrag rm train` or set reward.url")
    return ["reward", "--rm", str(head), "--config", str(config_file)]


def gpu_env(index: int | None) -> dict[str, str]:
    """The environment that pins a server to the plan's GPU ``index`` (a position among the GPUs this
    process sees: inside an outer ``CUDA_VISIBLE_DEVICES``, its ``index``-th entry); {} for the CPU plan."""
    if index is None:
        return {}
    outer = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return {"CUDA_VISIBLE_DEVICES": outer[index] if outer else str(index)}


class JobServices:
    """``urls`` maps "retriever" (None when not needed) and "reward" to base URLs. ``devices`` maps a
    server ("retriever", "reward") to the GPU index the placement plan gives it (absent or None: as
    its config's device says)."""

    def __init__(self, cfg, config_file: Path, log_dir: Path, need_retriever: bool, log=print,
                 devices: dict[str, int | None] | None = None):
        self.cfg, self.config_file, self.log_dir, self.log = cfg, config_file, Path(log_dir), log
        self.devices = devices or {}
        self.need = {"retriever": need_retriever, "reward": True}
        self.started: dict[str, ServerProcess] = {}
        self.urls: dict[str, str | None] = {}
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None

    @property
    def restarts(self) -> dict[str, int]:
        return {name: s.restarts for name, s in self.started.items()}

    def __enter__(self) -> JobServices:
        try:
            given = {"retriever": self.cfg.retriever.url, "reward": self.cfg.reward.url}
            makers = {"retriever": retriever_args, "reward": reward_args}
            for name in ("retriever", "reward"):
                if not self.need[name]:
                    self.urls[name] = None
                elif given[name]:
                    self.urls[name] = given[name]
                else:
                    self.urls[name] = self._launch(name, makers[name](self.cfg, self.config_file)).url
            for name, server in self.started.items():  # launched together, so they load side by side
                self._wait(name, server)
            self._watcher = threading.Thread(target=self._watch, name="job-services", daemon=True)
            self._watcher.start()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _launch(self, name: str, args: list[str]) -> ServerProcess:
        self.log(f"[job] starting {name} server: escrag serve {' '.join(args)}")
        server = ServerProcess(name, args, self.log_dir, None, env=gpu_env(self.devices.get(name)))
        self.started[name] = server
        return server

    def _wait(self, name: str, server: ServerProcess) -> None:
        server.wait(self.cfg.run.server_timeout_s)
        env = server.env
        where = f", CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']}" if env else ""
        self.log(f"[job] {name} server up at {server.url} (pid {server.proc.pid}{where})")

    def _watch(self) -> None:
        """Restart a started server that died, on its port; clients retry meanwhile."""
        while not self._stop.wait(self.cfg.run.supervise_s):
            for name, server in self.started.items():
                if server.alive() or self._stop.is_set():
                    continue
                self.log(f"[job] {name} server (pid {server.proc.pid}) exited with {server.proc.returncode}; "
                         f"restarting it on {server.url}")
                try:
                    server.restart(self.cfg.run.server_timeout_s)
                    self.log(f"[job] {name} server back at {server.url} (pid {server.proc.pid}, "
                             f"restart {server.restarts})")
                except ServiceError as exc:  # the next poll tries again; clients keep retrying
                    self.log(f"[job] {name} server restart failed: {str(exc).splitlines()[0]}")

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._watcher is not None and self._watcher.is_alive():  # a signal can land inside its start()
            self._watcher.join(timeout=30)
        for server in reversed(list(self.started.values())):
            server.stop()
