"""Shared fixtures: offline HF env, the tiny random model, one Ray session for the whole test run.

Ray is started at most once per test session (``ray_session``), on 127.0.0.1 with usage stats and the
dashboard off and its temp folder inside the project; it is shut down at the end of the session.
"""

from __future__ import annotations

import ast
import functools
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from escrag.runtime import tune_process

tune_process()  # before torch loads in this process, as a job's entry point does (escrag.runtime)

from escrag.web.procs import ServerProcess, free_port  # noqa: E402, F401  (free_port: used by tests)

ROOT = Path(__file__).resolve().parent.parent
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):  # `TEST_WORKERS=N make test`: N workers share the cores, so each torch
    # (and every server or job a test starts, which inherit this) gets its share: on 2 cores, 2 threads
    # per worker ran the crisis check's backbone 2-3x slower than 1 (threads fighting for cores)
    os.environ.setdefault("OMP_NUM_THREADS",
                          str(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))))
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # loopback-only head; Ray 2.60 turns token auth on
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")




@functools.cache
def _ray_tests(path: str) -> frozenset[str] | None:
    """The tests of a file that need the Ray worker, read from its source (the xdist controller does not
    collect): those whose fixtures (the file's own, followed through) include ``ray_session``, and
    those sharing one of the file's fixtures with such a test, so a module fixture is built once. None
    when the file names ``ray_session`` in a way this reading does not follow (the whole file goes)."""
    src = (ROOT / path).read_text()
    if "ray_session" not in src:
        return frozenset()
    funcs = {n.name: [a.arg for a in n.args.args] for n in ast.parse(src).body if isinstance(n, ast.FunctionDef)}
    fixtures = {n for n in funcs if not n.startswith("test_")}

    def closure(name: str) -> set[str]:
        seen, todo = set(), list(funcs[name])
        while todo:
            arg = todo.pop()
            if arg not in seen:
                seen.add(arg)
                todo += funcs.get(arg, []) if arg in fixtures else []
        return seen

    uses = {t: closure(t) for t in funcs if t.startswith("test_")}
    ray = {t for t, c in uses.items() if "ray_session" in c}
    if not ray:
        return None
    shared = set().union(*(uses[t] for t in ray)) & fixtures
    return frozenset(ray | {t for t, c in uses.items() if c & shared})


TIERS = ("unit", "gpu", "vllm")


def pytest_collection_modifyitems(config, items):
    """The tiers (pyproject's markers): a test under tests/gpu/ is ``gpu``; a module marks itself
    ``unit`` or ``vllm``; every other test is ``integration``."""
    for item in items:
        if "gpu" in Path(str(item.fspath)).parts:
            item.add_marker(pytest.mark.gpu)
        elif not any(item.get_closest_marker(t) for t in TIERS):
            item.add_marker(pytest.mark.integration)


def pytest_xdist_make_scheduler(config, log):
    """``TEST_WORKERS=N make test`` runs ``pytest -n N``: a module's tests stay on one worker (its module fixtures are
    built once) and every test that needs ``ray_session`` goes to one worker (``_ray_tests``), so Ray
    still starts once (``ray_session`` fails a second start). xdist's own ``--dist loadgroup`` would do
    this from marks, but with pytest 9 it drops the group from the node ids it sends."""
    from xdist.scheduler import LoadScopeScheduling

    if config.getvalue("dist") != "load":
        return None

    class ModuleOrRay(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path, _, rest = nodeid.partition("::")
            ray = _ray_tests(path)
            if ray is None or rest.split("[")[0].split("::")[-1] in ray:
                return "ray"
            return path

    return ModuleOrRay(config, log)


@pytest.fixture(scope="session")
def tiny_model() -> str:
    """Path of the seeded tiny random Qwen2 (hidden 64, 2 layers, SmolLM2 tokenizer)."""
    from escrag.models import resolve_model

    return resolve_model("tiny-random:qwen2")


@pytest.fixture(scope="session")
def safety_cache() -> None:
    """Load the crisis check once per session before any counselor server starts: on a fresh machine
    that converts SmolLM2 (its backbone) into $ESCRAG_CACHE, and fits the heads when data/safety/heads/
    has none for this config (~2.5 min), so the servers load within their /health wait."""
    from escrag.config import load_config
    from escrag.safety.classifier import RiskClassifier

    RiskClassifier.from_config(load_config("configs/cpu-test.yaml"))


@pytest.fixture(scope="session")
def esconv_index(tmp_path_factory) -> Path:
    """A 40-chunk exemplar index over ESConv train (``escrag index build --source esconv --limit 40``),
    built once for the tests that serve a retriever over it; they only read it."""
    from escrag import cli

    out = tmp_path_factory.mktemp("esconv-index") / "index"
    assert cli.main(["index", "build", "--source", "esconv", "--out", str(out), "--limit", "40"]) == 0
    return out


@pytest.fixture(scope="session")
def tokenizer(tiny_model):
    from escrag.models import load_tokenizer

    return load_tokenizer(tiny_model)


@dataclass
class RayCluster:
    address: str  # GCS address for ray.init
    dashboard_url: str  # for `ray job submit --address`


def _wait_http(url: str, proc: subprocess.Popen, log: Path, timeout: float) -> None:
    import httpx

    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{url} not up after {timeout} s:\n{log.read_text()[-4000:]}")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session")
def ray_session(tmp_path_factory):
    """One Ray head for the whole test session: loopback only, with the job server (dashboard) so
    that `ray job submit` can be tested, temp folder inside the project. The head runs under
    ``ray start --block`` as our child, so stopping it ends exactly the Ray processes we started."""
    import ray

    port, dash = free_port(), free_port()
    tmp = ROOT / ".cache" / "ray"
    tmp.mkdir(parents=True, exist_ok=True)
    run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID")  # set under `pytest -n N` (TEST_WORKERS=N make test)
    if run_id:  # a second worker asking for Ray means a Ray test escaped the "ray" group
        try:
            os.close(os.open(tmp / f"started-{run_id}", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            pytest.fail("a second xdist worker would start Ray: a test reaches ray_session in a way "
                        "_ray_tests does not read, so the scheduler did not put it on the Ray worker")
    log = tmp_path_factory.mktemp("ray") / "head.log"
    cmd = [str(Path(sys.executable).parent / "ray"), "start", "--head", "--block",
           "--node-ip-address=127.0.0.1", f"--port={port}", "--include-dashboard=true",
           "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}", "--num-cpus=8",
           # every port Ray would otherwise take at a fixed default, so two heads on a machine never clash
           *(f"--{name}={free_port()}" for name in ("dashboard-agent-listen-port", "dashboard-agent-grpc-port",
                                                     "runtime-env-agent-port", "metrics-export-port",
                                                     "ray-client-server-port")),
           f"--temp-dir={tmp}", "--disable-usage-stats"]
    with log.open("w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_http(f"http://127.0.0.1:{dash}/api/version", proc, log, timeout=120)
        ray.init(address=f"127.0.0.1:{port}", configure_logging=False)
        yield RayCluster(f"127.0.0.1:{port}", f"http://127.0.0.1:{dash}")
    finally:
        ray.shutdown()
        _stop(proc)


@contextmanager
def serving(tmp: Path, index: Path | None = None, rule: str | None = None, timeout: float = 180):
    """A retriever over ``index`` and/or a reward server with ``rule``, each a real ``escrag serve``
    process on a loopback port; yields {"retriever": url, "reward": url} once both answer /health and
    stops both on exit. The rollout, agent and learner tests' module fixtures start theirs with it."""
    procs = ([ServerProcess("retriever", ["retriever", "--index", str(index)], tmp, None)] if index else []) + \
            ([ServerProcess("reward", ["reward", "--rule", rule], tmp, None)] if rule else [])
    try:
        yield {p.name: p.wait(timeout).url for p in procs}
    finally:
        for p in procs:
            p.stop()


@pytest.fixture(scope="module")
def vowels_server(tmp_path_factory) -> str:
    """A reward server with the ``vowels`` rule (a signal a tiny random model can climb), per module."""
    with serving(tmp_path_factory.mktemp("rm"), rule="vowels") as urls:
        yield urls["reward"]


@pytest.fixture
def serve(tmp_path):
    """Start ``escrag serve <args>`` as a real process on a free loopback port; yields ``start(args)``
    which returns the base URL once ``/health`` answers. Every process is stopped at test end."""
    servers = []

    def start(args: list[str], timeout: float = 180) -> str:
        servers.append(ServerProcess(f"server-{len(servers)}", args, tmp_path, timeout))
        return servers[-1].url

    yield start
    for server in servers:
        server.stop()
