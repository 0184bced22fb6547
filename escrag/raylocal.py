"""Starting or joining Ray the way this project needs it.

Owns: the one place that calls ``ray.init``. A local Ray binds 127.0.0.1 only, has usage stats and
the dashboard off and keeps its temp folder where we say (where that path is too long for Ray's
sockets, in a short folder under the system temp dir named by its hash); joining a cluster
(``address``) changes none of the cluster's settings, and a cluster that is not there is one line
saying how to start a head.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from escrag.errors import UserError

HEAD_HINT = ("start a head first (`ray start --head --node-ip-address 127.0.0.1 --include-dashboard false`, "
             "docs/cluster.md), or leave ray.address unset to start a local Ray")


# Ray puts its AF_UNIX sockets at <temp dir>/session_<date>_<time>_<us>_<pid>/sockets/plasma_store (and
# raylet): at most this many characters after the temp dir, and a socket path has at most 107.
SOCKET_SUFFIX = len("/session_2026-12-07_12-42-51_158359_4194304/sockets/plasma_store")
SOCKET_PATH_MAX = 107


def socket_safe(tmpdir: str) -> str:
    """``tmpdir`` resolved, or where its path is too long for Ray's sockets (a deep run folder: Ray fails
    with ``AF_UNIX path length cannot exceed 107 bytes``), a short folder under the system temp dir named
    by its hash, and a line saying so."""
    full = str(Path(tmpdir).resolve())
    if len(full) + SOCKET_SUFFIX <= SOCKET_PATH_MAX:
        return full
    short = str(Path(tempfile.gettempdir()).resolve() / f"escrag-ray-{hashlib.sha256(full.encode()).hexdigest()[:12]}")
    if len(short) + SOCKET_SUFFIX > SOCKET_PATH_MAX:
        raise UserError(f"ray.tmpdir: {full!r} is too long for Ray's sockets, and so is {short!r} "
                        f"(TMPDIR); set ray.tmpdir to a folder of at most {SOCKET_PATH_MAX - SOCKET_SUFFIX} characters")
    print(f"[ray] {full} is too long for Ray's sockets ({len(full)} characters, at most "
        f"{SOCKET_PATH_MAX - SOCKET_SUFFIX}); its temp folder is {short}")
    return short


def _bootstrap_file() -> Path:
    """Where ``ray start --head`` records the cluster's address: ``<$RAY_TMPDIR, else $TMPDIR, else
    /tmp>/ray/ray_current_cluster``, as Ray looks it up."""
    base = os.environ.get("RAY_TMPDIR") or os.environ.get("TMPDIR") or "/tmp"
    return Path(base) / "ray" / "ray_current_cluster"


def init_ray(address: str | None = None, num_cpus: int | None = None, tmpdir: str | None = None,
             runtime_env: dict | None = None):
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    if ray.is_initialized():
        return ray
    if address == "auto" and not os.environ.get("RAY_ADDRESS") and not _bootstrap_file().is_file():
        # Ray's own "auto" would fall back to any Ray process on the machine (another user's test
        # session included); ours means the cluster `ray start` made, as its bootstrap file records.
        raise UserError(f"ray.address: 'auto': no running Ray cluster found; {HEAD_HINT}")
    if address:
        try:
            ray.init(address=address, runtime_env=runtime_env, log_to_driver=True)
        except ConnectionError:
            raise UserError(f"ray.address: {address!r}: no running Ray cluster found; {HEAD_HINT}") from None
        return ray
    # Ray >= 2.5x enables token auth for a new local cluster and writes ~/.ray/auth_token, after
    # which every later head on the machine demands the token; ours binds 127.0.0.1 only.
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if tmpdir:
        tmpdir = socket_safe(tmpdir)
        Path(tmpdir).mkdir(parents=True, exist_ok=True)
        os.environ["RAY_TMPDIR"] = tmpdir
    ray.init(num_cpus=num_cpus, include_dashboard=False, _node_ip_address="127.0.0.1",
             _temp_dir=os.environ.get("RAY_TMPDIR"), runtime_env=runtime_env,
             configure_logging=False)
    return ray
