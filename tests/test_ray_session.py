"""The session Ray head is loopback-only and runs real actors; it is the one every Ray test shares.
Run: .venv/bin/python -m pytest -q tests/test_ray_session.py"""

import os
from pathlib import Path

import ray


@ray.remote
class Echo:
    def node_ip(self):
        return ray.util.get_node_ip_address()


def test_actor_runs_on_loopback(ray_session):
    assert ray_session.address.startswith("127.0.0.1:")
    assert ray.get(Echo.remote().node_ip.remote()) == "127.0.0.1"


def test_joining_a_cluster_that_is_not_there_says_how_to_start_one(tmp_path):
    """``ray.address: auto`` with no head: one line naming the key and the command, exit 2, no
    traceback (it was Ray's own ConnectionError)."""
    import os
    import subprocess
    import sys

    code = ("import sys; from escrag.errors import run_main; from escrag.raylocal import init_ray; "
            "sys.exit(run_main('escrag', lambda: init_ray('auto')))")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"RAY_TMPDIR": str(tmp_path)}
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stderr
    assert "ray.address: 'auto': no running Ray cluster found" in res.stderr and "ray start --head" in res.stderr
    assert "Traceback" not in res.stderr


def test_a_temp_folder_too_long_for_rays_sockets_gets_a_short_one(tmp_path, capsys):
    """A deep run folder's default ``<output_dir>/ray`` made Ray fail with ``AF_UNIX path length cannot exceed
    107 bytes`` (a GRPO job under runs/heldout-gain-recipe-rm/grpo did); now it runs in a short folder."""
    import tempfile

    from escrag.raylocal import SOCKET_PATH_MAX, SOCKET_SUFFIX, socket_safe

    short = os.path.join(tempfile.gettempdir(), "escrag-t")
    assert socket_safe(short) == str(Path(short).resolve()) and capsys.readouterr().out == ""
    deep = tmp_path / ("run-" * 20) / "grpo" / "ray"
    got = socket_safe(str(deep))
    assert len(got) + SOCKET_SUFFIX <= SOCKET_PATH_MAX < len(str(deep)) + SOCKET_SUFFIX
    assert got == socket_safe(str(deep)) != socket_safe(str(deep / "other"))
    assert f"{deep} is too long for Ray's sockets" in capsys.readouterr().out


def test_the_socket_suffix_covers_what_ray_appends(ray_session):
    """``SOCKET_SUFFIX`` against the session head's real sockets (its temp folder: tests/conftest.py)."""
    from escrag.raylocal import SOCKET_SUFFIX

    temp = str((Path(__file__).resolve().parents[1] / ".cache" / "ray").resolve())
    node = next(n for n in ray.nodes() if n["Alive"])
    for sock in (node["ObjectStoreSocketName"], node["RayletSocketName"]):
        assert sock.startswith(temp + "/") and len(sock) - len(temp) <= SOCKET_SUFFIX
