"""The project's rooms and which may import which (docs/architecture.md), read from every import
statement of every module, function-level ones included (an AST walk, no import):

- the flat core (``escrag/*.py``) imports only itself; the CLI names handlers by ``_lazy("module:fn")``
  strings, and each must name a module file and a top-level function in it;
- the feature rooms of ``escrag/``: ``web`` (the HTTP kit) and ``safety`` read the core; ``llm`` the core
  and ``web``; ``safety`` may also use ``llm`` and ``web`` (a guard model); ``preference`` the core,
  ``llm`` and ``web``;
- the reward and retriever services import the core and ``escrag.web``;
- rollout imports the core, ``web``, ``llm``, ``safety`` and only the ``client``/``protocol`` modules of
  the two services; trainer the core, ``web``, ``safety``, rollout and, like rollout, the services' ``client``/``protocol``
  (the OpenRLHF agent, ``trainer/openrlhf/agent.py``, runs the episode against them); evaluation (an orchestration
  layer) the core, the feature rooms, rollout and the services, never the trainer or the jobs;
  ray_jobs anything but bench; bench (benchmarks) anything; nothing imports bench;
- experiments (``experiments/<name>/``) import anything but bench; nothing outside them imports them, the
  library's tests included (only ``tests/experiments/`` do);
- no import cycle between modules (function-level imports and the CLI's lazy targets count as edges),
  and none between rooms;
- no module imports another room's private (``_name``) names;
- package ``__init__`` files import nothing heavy (torch, transformers, faiss, vllm, openrlhf, ray).

Run: .venv/bin/python -m pytest -q tests/test_layers.py"""

import ast
import os
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("escrag", "reward_server", "retriever_server", "rollout", "trainer", "evaluation", "ray_jobs", "bench",
            "experiments")
FEATURES = ("web", "llm", "safety", "preference")  # escrag's feature rooms; the rest of escrag/ is the core
SERVICE_API = {"retriever_server.client", "retriever_server.protocol", "reward_server.client",
               "reward_server.protocol"}
FEATURE_ROOMS = {f"escrag.{f}" for f in FEATURES}
ALLOWED = {  # room -> the other rooms it may import (or, for the services' public API, single modules)
    "core": set(),
    "escrag.web": set(),
    "escrag.llm": {"escrag.web"},
    "escrag.safety": {"escrag.web", "escrag.llm"},
    "escrag.preference": {"escrag.web", "escrag.llm"},
    "reward_server": {"escrag.web"},
    "retriever_server": {"escrag.web"},
    "rollout": {"escrag.web", "escrag.llm", "escrag.safety"} | SERVICE_API,
    "trainer": {"escrag.web", "escrag.safety", "rollout"} | SERVICE_API,  # the OpenRLHF agent calls the services
    "evaluation": FEATURE_ROOMS | {"rollout", "retriever_server", "reward_server"},
    "ray_jobs": FEATURE_ROOMS | {"rollout", "trainer", "evaluation", "retriever_server", "reward_server"},
    "bench": FEATURE_ROOMS | {"rollout", "trainer", "evaluation", "retriever_server", "reward_server", "ray_jobs"},
    "experiments": FEATURE_ROOMS | {"rollout", "trainer", "evaluation", "retriever_server", "reward_server",
                                    "ray_jobs"},
}
HEAVY = {"torch", "transformers", "faiss", "vllm", "openrlhf", "ray", "deepspeed", "peft", "sentence_transformers"}
LAZY = re.compile(r"""_lazy\(\s*["']([\w.]+):(\w+)["']\s*\)""")


def room(module: str) -> str:
    """The room of a dotted module name: ``core``, ``escrag.<feature>`` or the top-level package."""
    parts = module.split(".")
    if parts[0] == "escrag":
        return f"escrag.{parts[1]}" if len(parts) > 1 and parts[1] in FEATURES else "core"
    return parts[0]


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the project's packages under ``root``; nothing
    under a hidden folder (``bench/.cache/venv-trl``, which bench/bench_grpo_vs_trl.py creates, holds
    TRL's own packages, not ours)."""
    out = {}
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")) if (root / pkg).is_dir() else []:
            parts = list(path.relative_to(root).with_suffix("").parts)
            if any(part.startswith(".") for part in parts):
                continue
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imports(path: Path, modules: dict[str, Path]):
    """(imported module, imported names) for every import statement anywhere in the file; a
    ``from pkg import sub`` of a project submodule counts as an import of ``pkg.sub``."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, []
        elif isinstance(node, ast.ImportFrom) and node.module:
            subs = [a.name for a in node.names if f"{node.module}.{a.name}" in modules]
            for name in subs:
                yield f"{node.module}.{name}", []
            rest = [a.name for a in node.names if a.name not in subs]
            if rest or not subs:
                yield node.module, rest


def lazy_targets(path: Path) -> list[tuple[str, str]]:
    """The CLI's ``_lazy("module:function")`` handlers."""
    return LAZY.findall(path.read_text())


def allowed(src_room: str, module: str) -> bool:
    if module.split(".")[0] not in PACKAGES:
        return True
    dst = room(module)
    if dst in (src_room, "core"):
        return True
    rules = ALLOWED[src_room]
    return dst in rules or any(module == m or module.startswith(m + ".") for m in rules)


def edges(modules: dict[str, Path], lazy: bool = True) -> dict[str, set[str]]:
    """Module -> the project modules it imports (with ``lazy``, the CLI's lazy targets too)."""
    out = {}
    for name, path in modules.items():
        targets = {m for m, _ in imports(path, modules) if m in modules}
        targets |= {m for m, _ in lazy_targets(path) if m in modules} if lazy else set()
        out[name] = targets - {name}
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan, iterative)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        top = stack.pop()
                        on.discard(top)
                        comp.append(top)
                        if top == node:
                            break
                    if len(comp) > 1:
                        found.append(sorted(comp))
            elif nxt not in index:
                index[nxt] = low[nxt] = counter[0]
                counter[0] += 1
                stack.append(nxt)
                on.add(nxt)
                work.append((nxt, iter(sorted(graph.get(nxt, ())))))
            elif nxt in on:
                low[node] = min(low[node], index[nxt])
    return found


MODULES = module_files()


def test_modules_found():
    assert len(MODULES) > 60 and any(room(m) == "bench" for m in MODULES)
    assert {room(m) for m in MODULES} == set(ALLOWED)


def test_hidden_folders_hold_no_project_modules(tmp_path):
    """A benchmark's side environment under bench/.cache is not part of the project: its packages' own
    imports (TRL's ``trainer`` is not ours) must not be read as the project's."""
    for rel in ("bench/bench_a.py", "bench/.cache/venv-trl/lib/site-packages/trl/kernels/__init__.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("import transformers\n")
    assert module_files(tmp_path) == {"bench.bench_a": tmp_path / "bench/bench_a.py"}


@pytest.mark.parametrize("src_room", sorted(ALLOWED))
def test_layer_rules(src_room):
    broken = [f"{path.relative_to(ROOT)} imports {module}"
              for name, path in MODULES.items() if room(name) == src_room
              for module, _ in imports(path, MODULES) if not allowed(src_room, module)]
    assert not broken, "\n".join(broken)


def test_nothing_imports_bench():
    broken = [f"{path.relative_to(ROOT)} imports {m}" for name, path in MODULES.items() if room(name) != "bench"
              for m, _ in imports(path, MODULES) if m.split(".")[0] == "bench"]
    assert not broken, "\n".join(broken)


def test_nothing_outside_experiments_imports_them():
    """The library, the benchmarks and the tests of the library import nothing from ``experiments/``;
    only an experiment's own tests (``tests/experiments/``) do."""
    tests = {f"tests.{p.stem}": p for p in sorted((ROOT / "tests").rglob("*.py"))
             if "experiments" not in p.relative_to(ROOT / "tests").parts}
    broken = [f"{path.relative_to(ROOT)} imports {m}" for name, path in {**MODULES, **tests}.items()
              if room(name) != "experiments" for m, _ in imports(path, MODULES) if m.split(".")[0] == "experiments"]
    assert len(tests) > 40 and not broken, "\n".join(broken)


def test_cli_lazy_targets_exist():
    targets = lazy_targets(ROOT / "escrag" / "cli.py")
    assert len(targets) > 15
    missing = []
    for module, func in targets:
        path = MODULES.get(module)
        defined = path and {n.name for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef)}
        if not defined or func not in defined:
            missing.append(f"{module}:{func}")
    assert not missing, "the CLI names handlers that do not exist: " + ", ".join(missing)


def test_no_import_cycles():
    found = cycles(edges(MODULES))
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_no_cycles_between_rooms():
    """The CLI's lazy targets are left out here: they are entry points, not a layer the core stands on."""
    graph = {}
    for src, targets in edges(MODULES, lazy=False).items():
        graph.setdefault(room(src), set()).update(room(t) for t in targets if room(t) != room(src))
    assert not cycles(graph), cycles(graph)


def test_no_private_names_across_rooms():
    broken = []
    for name, path in MODULES.items():
        for module, names in imports(path, MODULES):
            if module.split(".")[0] in PACKAGES and room(module) != room(name):
                broken += [f"{path.relative_to(ROOT)}: from {module} import {n}" for n in names if n.startswith("_")]
    assert not broken, "\n".join(broken)


def test_package_inits_are_light():
    heavy = [f"{path.relative_to(ROOT)} imports {module}" for path in MODULES.values() if path.name == "__init__.py"
             for module, _ in imports(path, MODULES) if module.split(".")[0] in HEAVY]
    assert not heavy, "\n".join(heavy)


def test_the_checker_catches_violations_and_cycles(tmp_path):
    """The checker itself, on a tree made here: a core module importing a role, a private name, and a
    cycle hidden behind a function-level import are all found."""
    (tmp_path / "escrag" / "safety").mkdir(parents=True)
    (tmp_path / "rollout").mkdir()
    (tmp_path / "escrag" / "__init__.py").write_text("")
    (tmp_path / "escrag" / "safety" / "__init__.py").write_text("")
    (tmp_path / "escrag" / "safety" / "a.py").write_text("from escrag.safety.b import x\n")
    (tmp_path / "escrag" / "safety" / "b.py").write_text("def x():\n    from escrag.safety import a\n")
    (tmp_path / "escrag" / "bad.py").write_text("from rollout.episode import _ACTION\nimport trainer.learner\n")
    (tmp_path / "rollout" / "episode.py").write_text("_ACTION = 1\n")
    mods = module_files(tmp_path)
    assert cycles(edges(mods)) == [["escrag.safety.a", "escrag.safety.b"]]
    found = list(imports(tmp_path / "escrag" / "bad.py", mods))
    assert ("rollout.episode", ["_ACTION"]) in found
    assert not allowed("core", "rollout.episode") and not allowed("core", "trainer.learner")
    assert not allowed("escrag.web", "escrag.safety.classifier") and allowed("escrag.llm", "escrag.web.retry")
    assert allowed("rollout", "reward_server.client") and not allowed("rollout", "reward_server.model")
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_importing_escrag_changes_nothing_and_tune_process_sets_the_spin_before_torch_loads():
    """``import escrag`` (and its config, models and CLI modules) leaves the environment and glibc alone;
    ``escrag.runtime.tune_process()`` sets ``GOMP_SPINCOUNT`` unless the user set one, and a job's
    entry point (``run_main``) calls it before torch loads."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "GOMP_SPINCOUNT"}

    def run(code, **extra):
        return subprocess.run([sys.executable, "-c", code], env={**env, **extra}, capture_output=True, text=True,
                              check=True).stdout.strip()

    assert run("import os, escrag, escrag.config, escrag.models, escrag.cli; "
               "print(os.environ.get('GOMP_SPINCOUNT'))") == "None"
    tuned = "import os; from escrag.runtime import tune_process; tune_process(); import torch; "
    assert run(tuned + "print(os.environ['GOMP_SPINCOUNT'])") == "20000"
    assert run(tuned + "print(os.environ['GOMP_SPINCOUNT'])", GOMP_SPINCOUNT="7") == "7"  # the user's value stays
    assert run("import os, sys; from escrag.errors import run_main; "
               "run_main('t', lambda: print(os.environ['GOMP_SPINCOUNT'], 'torch' in sys.modules))") == "20000 False"
