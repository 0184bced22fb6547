"""``escrag config show``: the resolved config, every key with its value and help text.

Owns: ``describe`` and the command's handler ``show_main``.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from escrag.config.load import load_config


def _sections_in(value) -> list[tuple[str, Any]]:
    """(path suffix, section) of each item of a non-empty list or mapping of sections, else []."""
    if isinstance(value, dict):
        items = [(f".{k}", v) for k, v in value.items()]
    elif isinstance(value, list):
        items = [(f"[{i}]", v) for i, v in enumerate(value)]
    else:
        return []
    return items if items and all(dataclasses.is_dataclass(v) for _, v in items) else []


def describe(section, prefix: str = "") -> list[str]:
    """``key.path: value  # help`` lines of a config (or one section); a section opens with ``# path: help``."""
    lines = []
    for f in dataclasses.fields(section):
        value, path = getattr(section, f.name), f"{prefix}{f.name}"
        doc = type(section).__pydantic_fields__[f.name].description
        if dataclasses.is_dataclass(value):
            lines += [f"# {path}: {doc}", *describe(value, f"{path}.")]
        elif subs := _sections_in(value):
            for suffix, item in subs:
                lines += [f"# {path}{suffix}: {doc}", *describe(item, f"{path}{suffix}.")]
        else:
            lines.append(f"{path}: {json.dumps(value, ensure_ascii=False)}  # {doc}")
    return lines


def show_main(args) -> int:
    """Handler of ``escrag config show``: the resolved config, each key with its help text."""
    cfg = load_config(args.file, args.override)
    print(f"# {args.file or 'defaults'}" + "".join(f" -o {o}" for o in args.override))
    print("\n".join(describe(cfg)))
    return 0


