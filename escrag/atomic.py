"""Atomic writes of files and folders: a reader sees the old version or the new one, never half of one.

Owns: ``atomic_file`` (a handle on a temp file in the target's folder, renamed over the target when
the block ends without error), the ``write_text`` / ``write_json`` shorthands, ``atomic_dir``
(a temp folder that replaces the target folder when the block ends without error), and
``read_manifest``, the one reader of the ``manifest.json`` that an index or reward-model folder is
written with (last, so a folder with a manifest is complete).

Replacing an existing folder uses Linux's ``renameat2(RENAME_EXCHANGE)``, which swaps the two paths
in one step, so there is no moment without a folder at the target; the old folder is then removed.
Where the call is missing (another OS, an old libc), the old folder is renamed aside first and a gap
of one rename remains. On error the temp file or folder is removed and the target is untouched.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from escrag.errors import UserError

_AT_FDCWD, _RENAME_EXCHANGE = -100, 2
MANIFEST_FILE = "manifest.json"


@contextlib.contextmanager
def atomic_file(path: str | Path, mode: str = "w", encoding: str | None = "utf-8") -> Iterator:
    """``with atomic_file(p) as fh: fh.write(...)``; ``mode`` is "w" (text) or "wb" (bytes)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode, encoding=None if "b" in mode else encoding) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text(path: str | Path, text: str) -> Path:
    with atomic_file(path) as fh:
        fh.write(text)
    return Path(path)


def json_text(data, indent: int | None = None, **kw) -> str:
    """JSON that any text survives a UTF-8 file in: non-ASCII stays readable, but when a string holds a
    lone surrogate (which UTF-8 cannot encode: a provider's broken answer) the whole text is escaped."""
    text = json.dumps(data, indent=indent, ensure_ascii=False, **kw)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = json.dumps(data, indent=indent, **kw)
    return text


def write_json(path: str | Path, data, indent: int | None = 2) -> Path:
    return write_text(path, json_text(data, indent) + "\n")


def read_manifest(folder: str | Path, what: str, hint: str, fields: tuple[str, ...]) -> dict:
    """``folder/manifest.json``; a UserError naming the folder as not ``what`` ("an index folder") with
    ``hint`` (how to make one) when there is none, naming the file when it is not a JSON object or
    lacks one of ``fields``."""
    path = Path(folder) / MANIFEST_FILE
    if not path.is_file():
        raise UserError(f"{folder}: not {what} (no {MANIFEST_FILE}; {hint})")
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: invalid JSON ({exc.msg})") from None
    if not isinstance(manifest, dict):
        raise UserError(f"{path}: not a JSON object")
    missing = [k for k in fields if k not in manifest]
    if missing:
        raise UserError(f"{path}: missing field(s) {', '.join(missing)}")
    return manifest


@contextlib.contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """``with atomic_dir(out) as tmp: <write files into tmp>``; ``out`` is replaced as a whole."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=path.parent))
    try:
        yield tmp
        tmp.chmod(0o777 & ~_umask())  # mkdtemp makes it private; the final folder gets the usual mode
        _replace_dir(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # after an exchange, tmp holds the old folder


def _replace_dir(new: Path, target: Path) -> None:
    if target.exists() and _exchange(new, target):
        return
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}-old-{os.getpid()}")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(target, old)
    os.replace(new, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step; False when the system cannot."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    return fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
