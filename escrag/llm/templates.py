"""Versioned prompt templates under ``escrag/templates/``: one way to find, read and version them.

Owns: ``TEMPLATE_DIR``, ``locate`` (a template name checked against what the folder holds: a
``<name>.txt`` file, the judge's, or a ``<name>/`` folder, a prompt set of preference construction),
``read_sections`` (a file's ``### name`` sections) and ``version`` (``name@<12 hex of a sha256>``, the
string saved pairs, judgments and cache keys record). What is hashed is the caller's: the judge hashes
its file's bytes, a prompt set each of its files with its name.
"""

from __future__ import annotations

import re
from pathlib import Path

from escrag.config import ConfigError

TEMPLATE_DIR = Path(__file__).resolve().parents[1] / "templates"  # escrag/templates/


def locate(name: str, *, folder: bool, key: str, what: str) -> Path:
    """``TEMPLATE_DIR/<name>/`` (``folder``) or ``TEMPLATE_DIR/<name>.txt``; else a ConfigError naming
    the config ``key`` and the known names."""
    known = {p.name if folder else p.stem: p for p in TEMPLATE_DIR.iterdir()
             if (p.is_dir() if folder else p.suffix == ".txt" and p.is_file())}
    if name not in known:
        raise ConfigError(f"{key}: no {what} {name!r} (known: {', '.join(sorted(known))})")
    return known[name]


def read_sections(path: Path, names: tuple[str, ...]) -> dict[str, str]:
    """A template file's ``### name`` sections (stripped); it must hold exactly ``names``."""
    parts = re.split(r"^### (\w+)\n", path.read_text(encoding="utf-8"), flags=re.MULTILINE)
    sections = {parts[i]: parts[i + 1].strip() for i in range(1, len(parts) - 1, 2)}
    if set(sections) != set(names):
        raise ConfigError(f"{path}: needs exactly the sections {', '.join(names)}")
    return sections


def version(name: str, sha256_hex: str) -> str:
    return f"{name}@{sha256_hex[:12]}"
