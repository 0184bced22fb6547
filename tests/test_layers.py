"""The project's layer rules, read from the import statements of every module (an AST walk, no import):

- the core (``escrag/``) imports no other package of the project (the CLI names handlers by string);
- the reward and retriever services import only the core and themselves;
- rollout imports the core, itself and only the ``client``/``protocol`` modules of the two services;
- trainer imports the core, itself and rollout; evaluation (an orchestration layer, like the jobs)
  imports the core, itself, rollout and the services' public modules, never the trainer or the jobs;
  ray_jobs may import anything;
- no module imports another package's private (``_name``) names;
- package ``__init__`` files import nothing heavy (torch, transformers, faiss, vllm, openrlhf, ray).

Run: .venv/bin/python -m pytest -q tests/test_layers.py"""

import ast
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("escrag", "reward_server", "retriever_server", "rollout", "trainer", "evaluation", "ray_jobs")
SERVICE_API = {"retriever_server.client", "retriever_server.protocol", "reward_server.client",
               "reward_server.protocol"}
ALLOWED = {  # package -> (other packages it may import, or specific modules)
    "escrag": set(),
    "reward_server": set(),
    "retriever_server": set(),
    "rollout": SERVICE_API,
    "trainer": {"rollout"},
    "evaluation": {"rollout", "retriever_server", "reward_server"},
    "ray_jobs": set(PACKAGES),
}
HEAVY = {"torch", "transformers", "faiss", "vllm", "openrlhf", "ray", "deepspeed", "peft", "sentence_transformers"}


def _modules():
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")) if (ROOT / pkg).is_dir() else []:
            yield pkg, path


def _imports(path: Path):
    """(imported module, imported names) for every import statement, relative ones resolved."""
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, []
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module, [a.name for a in node.names]


def _allowed(pkg: str, module: str) -> bool:
    top = module.split(".")[0]
    if top not in PACKAGES or top in (pkg, "escrag"):
        return True
    rules = ALLOWED[pkg]
    return top in rules or any(module == m or module.startswith(m + ".") for m in rules)


def test_modules_found():
    assert sum(1 for _ in _modules()) > 40


@pytest.mark.parametrize("pkg", PACKAGES)
def test_layer_rules(pkg):
    broken = [f"{path.relative_to(ROOT)} imports {module}"
              for p, path in _modules() if p == pkg
              for module, _ in _imports(path) if not _allowed(pkg, module)]
    assert not broken, "\n".join(broken)


def test_no_private_names_across_packages():
    broken = []
    for pkg, path in _modules():
        for module, names in _imports(path):
            top = module.split(".")[0]
            if top in PACKAGES and top != pkg:
                broken += [f"{path.relative_to(ROOT)}: from {module} import {n}" for n in names if n.startswith("_")]
    assert not broken, "\n".join(broken)


def test_package_inits_are_light():
    heavy = [f"{path.relative_to(ROOT)} imports {module}" for pkg, path in _modules() if path.name == "__init__.py"
             for module, _ in _imports(path) if module.split(".")[0] in HEAVY]
    assert not heavy, "\n".join(heavy)


def test_the_rules_catch_a_violation(tmp_path):
    """The checker itself: a core module importing a role, and a private name, are both found."""
    bad = tmp_path / "bad.py"
    bad.write_text("from rollout.episode import _ACTION\nimport trainer.learner\n")
    found = list(_imports(bad))
    assert not _allowed("escrag", "rollout.episode") and not _allowed("escrag", "trainer.learner")
    assert ("rollout.episode", ["_ACTION"]) in found
    assert _allowed("rollout", "reward_server.client") and not _allowed("rollout", "reward_server.model")


def test_escrag_sets_a_short_openmp_spin_before_torch_loads():
    import subprocess
    import sys

    code = "import escrag, os, torch; print(os.environ['GOMP_SPINCOUNT'])"
    env = {k: v for k, v in os.environ.items() if k != "GOMP_SPINCOUNT"}
    assert subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True).stdout.strip() == "20000"
    assert subprocess.run([sys.executable, "-c", code], env={**env, "GOMP_SPINCOUNT": "7"}, capture_output=True,
                          text=True, check=True).stdout.strip() == "7"  # the user's value stays
