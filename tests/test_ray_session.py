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
