"""The shared request guard of every service (escrag/web/serving.py) against hostile input: raw-byte
and escaped lone surrogates, deep nesting, random paths, keys, and what unauthenticated callers and
502s reveal. Each case failed on the code before issue 25 (a 500, an unbounded /metrics, details on
/health, an upstream URL in a 502). The app is real (FastAPI, in-process); one case runs the real
reward server over a socket.

Run: .venv/bin/python -m pytest -q tests/test_serving_guard.py"""

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import BaseModel

from escrag.errors import ServiceError
from escrag.web import serving
from escrag.web.serving import add_common

KEY = "s3cret-key"


class Item(BaseModel):
    text: str


def _app(api_key: str | None = None) -> FastAPI:
    app = FastAPI()
    add_common(app, "guardtest", api_key=api_key, health=lambda: {"model_dir": "/srv/models/private-rm"})

    @app.post("/encode")
    async def encode(item: Item):
        return {"bytes": len(item.text.encode("utf-8"))}  # what a tokenizer does first

    @app.get("/items/{item_id}")
    async def get_item(item_id: int):
        return {"id": item_id}

    @app.post("/upstream")
    async def upstream():
        raise ServiceError("http://10.0.0.7:9000/score failed: connection refused (token=abc)")

    return app


def _post(client, body: bytes, **headers):
    return client.post("/encode", content=body, headers={"content-type": "application/json", **headers})


def test_raw_byte_surrogate_is_a_400_not_a_500():
    with TestClient(_app(), raise_server_exceptions=False) as c:
        r = _post(c, b'{"text": "fine \xed\xa0\x80 then"}')  # U+D800 as raw (CESU-style) bytes
        assert r.status_code == 400 and "UTF-8" in r.json()["detail"]
        assert _post(c, b'{"text": "caf\xc3\xa9"}').json() == {"bytes": 5}  # ordinary UTF-8 passes
        r = _post(c, b'{"text": "\\ud800"}')  # the escaped form, refused before
        assert r.status_code == 400 and "surrogate" in r.json()["detail"]


def test_deep_nesting_around_an_escaped_surrogate_is_a_400():
    depth = 200_000
    body = b'{"text": ' + b"[" * depth + b'"\\udc00"' + b"]" * depth + b"}"
    with TestClient(_app(), raise_server_exceptions=False) as c:
        r = _post(c, body)
        assert r.status_code == 400 and "nested" in r.json()["detail"]
        assert _post(c, b"[" * depth + b"]" * depth).status_code < 500  # FastAPI's own parse


def _metric_lines(c, **headers) -> list[str]:
    return [ln for ln in c.get("/metrics", headers=headers).text.splitlines() if ln.startswith("guardtest_")]


def test_metrics_stay_bounded_under_random_paths_and_use_route_templates():
    with TestClient(_app(api_key=KEY), raise_server_exceptions=False) as c:
        def burst(start: int, n: int) -> int:
            for i in range(start, start + n):
                assert c.get(f"/random/{i}/path-{i * 7}").status_code == 401
                assert c.get(f"/items/{i}", headers={"authorization": f"Bearer {KEY}"}).json() == {"id": i}
            return len(_metric_lines(c))

        _metric_lines(c)  # the scrape itself is counted from the second one on
        after_ten = burst(0, 10)
        assert burst(10, 190) == after_ten  # 190 more distinct paths add no series (was ~19 lines a path)
        lines = _metric_lines(c)
        assert any('path="unmatched",status="401"' in ln for ln in lines)
        assert any('path="/items/{item_id}",status="200"' in ln for ln in lines)
        assert not any("/random/" in ln or 'path="/items/3"' in ln for ln in lines)


def test_key_is_compared_in_constant_time(monkeypatch):
    calls = []
    real = serving.hmac.compare_digest

    def spy(a, b):
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(serving.hmac, "compare_digest", spy)
    with TestClient(_app(api_key=KEY), raise_server_exceptions=False) as c:
        ok = _post(c, b'{"text": "hi"}', authorization=f"Bearer {KEY}")
        same_length = _post(c, b'{"text": "hi"}', authorization=f"Bearer {'x' * len(KEY)}")
        none = _post(c, b'{"text": "hi"}')
    assert (ok.status_code, same_length.status_code, none.status_code) == (200, 401, 401)
    assert len(calls) >= 3


def test_unauthenticated_health_shows_liveness_only():
    with TestClient(_app(api_key=KEY)) as c:
        assert c.get("/health").json() == {"status": "ok"}
        authed = c.get("/health", headers={"authorization": f"Bearer {KEY}"}).json()
        assert authed == {"status": "ok", "model_dir": "/srv/models/private-rm"}
    with TestClient(_app(api_key=None)) as c:  # no key configured: an open server shows its details
        assert c.get("/health").json()["model_dir"] == "/srv/models/private-rm"


def test_502_names_no_upstream_detail(caplog):
    with TestClient(_app(), raise_server_exceptions=False) as c, caplog.at_level("WARNING", "escrag.web"):
        r = c.post("/upstream")
    assert r.status_code == 502
    assert "10.0.0.7" not in r.text and "token" not in r.text and "connection refused" not in r.text
    assert "10.0.0.7:9000" in caplog.text  # logged for the operator


@pytest.mark.timeout(300)
def test_real_reward_server_refuses_raw_surrogates_over_a_socket(serve):
    url = serve(["reward", "--rule", "keyword:hello"])
    body = b'{"items": [{"history": [{"role": "user", "content": "hi"}], "output": "hello \xed\xb0\x80"}]}'
    r = httpx.post(f"{url}/score", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400 and "UTF-8" in r.json()["detail"]
    good = httpx.post(f"{url}/score", json={"items": [{"history": [{"role": "user", "content": "hi"}],
                                                       "output": "hello"}]})
    assert good.status_code == 200
