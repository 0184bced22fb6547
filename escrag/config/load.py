"""Loading a config: YAML + ``key.path=value`` overrides -> a validated ``Config`` (or an experiment's
subclass of it), and pydantic's errors as one message naming the key path
(``grpo.clip_eps: must be <= 1, got 3.0``): an unknown key, a wrong type or an out-of-range value.

Owns: ``load_config``, ``from_dict``, ``to_dict``, ``output_path``.
"""

from __future__ import annotations

import copy
import dataclasses
import types
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import TypeAdapter, ValidationError

from escrag.config.schema import Config, ConfigError

_ADAPTERS: dict[type, TypeAdapter] = {}
_BOUNDS = {"greater_than_equal": ("ge", ">="), "greater_than": ("gt", ">"),
           "less_than_equal": ("le", "<="), "less_than": ("lt", "<")}
_SCALARS = {"int_type": "int", "float_type": "float", "bool_type": "bool", "string_type": "str"}
_UNKNOWN = ("unexpected_keyword_argument", "extra_forbidden")


def _key_path(loc: tuple) -> str:
    """pydantic's ``loc`` as the key path: ``("eval", "systems", 0, "k")`` -> ``eval.systems[0].k``."""
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path


def _strip_optional(tp):
    """``X | None`` -> ``X``; anything else as it is."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return next(a for a in typing.get_args(tp) if a is not type(None))
    return tp


def _type_at(loc: tuple, schema: type):
    """The annotation (Optional and Annotated stripped) of the value at ``loc`` under ``schema``."""
    tp = schema
    for part in loc:
        if dataclasses.is_dataclass(tp):
            tp = _strip_optional(typing.get_type_hints(tp)[part])
        else:  # a list's item or a mapping's value
            tp = _strip_optional(typing.get_args(tp)[-1])
    return tp


def _message(err: dict, schema: type) -> str:
    """One pydantic error as ``key.path: what is wrong, got what``."""
    loc, kind, value, ctx = err["loc"], err["type"], err.get("input"), err.get("ctx") or {}
    path = _key_path(loc)
    if isinstance(ctx.get("error"), ConfigError):  # a rule across sections (Config.__post_init__) names its keys
        return str(ctx["error"])
    if kind in _UNKNOWN:
        known = ", ".join(sorted(f.name for f in dataclasses.fields(_type_at(loc[:-1], schema))))
        return f"{path}: unknown key (known: {known})"
    if kind in _BOUNDS:
        key, sym = _BOUNDS[kind]
        return f"{path}: must be {sym} {ctx[key]}, got {value!r}"
    if kind == "literal_error":
        return f"{path}: must be one of {list(typing.get_args(_type_at(loc, schema)))}, got {value!r}"
    if kind in _SCALARS:
        return f"{path}: expected {_SCALARS[kind]}, got {type(value).__name__} {value!r}"
    if kind in ("dataclass_type", "dataclass_exact_type", "dict_type"):
        return f"{path}: expected a mapping, got {type(value).__name__}"
    if kind == "list_type":
        return f"{path}: expected a list, got {type(value).__name__}"
    return f"{path}: {err['msg']}"


def _set_path(tree: dict, dotted: str, value) -> None:
    *parents, leaf = dotted.split(".")
    for p in parents:
        tree = tree.setdefault(p, {})
        if not isinstance(tree, dict):
            raise ConfigError(f"{dotted}: {p} is not a section")
    tree[leaf] = value


def from_dict(data: dict, overrides: list[str] = (), schema: type = Config) -> Config:
    """Build a Config from a mapping plus ``key.path=value`` overrides (values parsed as YAML).
    ``schema``: ``Config`` or a subclass of it with sections of its own (an experiment's)."""
    data = copy.deepcopy(dict(data or {}))
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"{item}: override must look like section.key=value")
        key, raw = item.split("=", 1)
        _set_path(data, key.strip(), yaml.safe_load(raw))
    try:
        return _ADAPTERS.setdefault(schema, TypeAdapter(schema)).validate_python(data)
    except ValidationError as exc:
        errors = exc.errors()  # one message, like a hand-written loader: an unknown key first (a typo)
        raise ConfigError(_message(next((e for e in errors if e["type"] in _UNKNOWN), errors[0]), schema)) from None


def load_config(path: str | Path | None = None, overrides: list[str] = (), schema: type = Config) -> Config:
    """Load a YAML preset (None: all defaults) and apply overrides; errors name file and key."""
    data: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"{path}: config file not found")
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: invalid YAML: {exc}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: top level must be a mapping")
    try:
        return from_dict(data, overrides, schema)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}" if path else str(exc)) from None


def to_dict(cfg) -> dict:
    return dataclasses.asdict(cfg)


def output_path(cfg: Config, *parts: str) -> Path:
    """A path under ``run.output_dir``."""
    return Path(cfg.run.output_dir, *parts)


