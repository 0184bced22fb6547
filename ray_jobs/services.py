"""The retriever and reward servers a job needs: use given URLs, or start them as child processes.

Owns: ``job_services`` (a context manager yielding (retriever_url,
reward_url) and stopping only the servers it started, also on error). Servers get the job's resolved
config file so their numbers match the job's.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from escrag.errors import UserError
from escrag.servers import ServerProcess


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
