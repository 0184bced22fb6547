"""The session Ray head is loopback-only and runs real actors; it is the one every Ray test shares.
Run: .venv/bin/python -m pytest -q tests/test_ray_session.py"""

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
