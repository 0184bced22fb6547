"""The one retry policy (escrag/web/retry.py) and both clients that use it.

Checks: the pure rules (Retry-After as seconds, as an HTTP date, garbage, negative, a date past; the
backoff doubles, jitters within its range and is capped, Retry-After is capped too; attempts and the
deadline bound the loop; a non-retryable error is not retried); then, through a real HTTP server on
127.0.0.1 started here, ``AsyncJsonClient`` and ``ChatEndpoint`` both ride out 503s whose
``Retry-After`` is garbage (the backoff applies), negative (the backoff applies: the chat client used
to retry at once) and an HTTP date (honoured: both clients used to ignore dates and retry after their
backoff), and succeed with the same waits.
Run: .venv/bin/python -m pytest -q tests/test_retry.py"""

import asyncio
import contextlib
import json
import threading
import time
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from escrag.config import EndpointConfig
from escrag.llm.endpoint import ChatEndpoint
from escrag.web.client import AsyncJsonClient
from escrag.web.retry import GaveUp, Retryable, RetryPolicy, retry_after, retryable_status

CHAT_ANSWER = {"choices": [{"message": {"role": "assistant", "content": "ok"}}],
               "usage": {"prompt_tokens": 1, "completion_tokens": 1}}


def header(value: str) -> float | None:
    return retry_after(httpx.Response(503, headers={"Retry-After": value}))


# ----------------------------------------------------------------------------- the pure rules


def test_retry_after_reads_seconds_and_dates_and_nothing_else():
    assert header("2") == 2.0 and header(" 0.5 ") == 0.5 and header("0") == 0.0
    assert 8.0 < header(formatdate(time.time() + 10, usegmt=True)) <= 10.0
    assert 8.0 < header(formatdate(time.time() + 10)[:-6]) <= 10.0  # a date without a zone is GMT
    for garbage in ("soon", "", "1 hour", "nan", "-1", "-0.5", formatdate(time.time() - 60, usegmt=True)):
        assert header(garbage) is None, garbage
    assert retry_after(httpx.Response(503)) is None


def test_which_statuses_are_retried():
    assert [s for s in (400, 401, 404, 409, 422, 429, 500, 501, 502, 503, 504, 520) if retryable_status(s)] \
        == [429, 500, 501, 502, 503, 504, 520]


def test_delay_doubles_jitters_and_is_capped():
    plain = RetryPolicy(base_s=0.5, max_s=4.0)
    assert [plain.delay(n) for n in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert plain.delay(10_000) == 4.0  # a long deadline-bound loop does not overflow
    assert plain.delay(1, retry_after=3.0) == 3.0 and plain.delay(5, retry_after=0.1) == 0.1  # replaces
    assert plain.delay(1, retry_after=100.0) == 4.0  # capped, Retry-After included
    jittered = RetryPolicy(base_s=1.0, max_s=60.0, jitter=True)
    waits = [jittered.delay(3) for _ in range(200)]
    assert all(2.0 <= w <= 4.0 for w in waits) and len(set(waits)) > 1
    assert jittered.delay(30) == 60.0 and jittered.delay(2, retry_after=0.25) == 0.25  # no jitter on either


def test_attempts_and_deadline_bound_the_loop():
    calls = []

    async def failing():
        calls.append(time.monotonic())
        raise Retryable(f"HTTP 503 #{len(calls)}")

    with pytest.raises(GaveUp) as err:
        asyncio.run(RetryPolicy(base_s=0.0, max_s=1.0, attempts=3).run(failing))
    assert (err.value.attempts, err.value.cause, len(calls)) == (3, "HTTP 503 #3", 3)
    calls.clear()
    with pytest.raises(GaveUp) as err:  # waits 0.05, 0.1, then the next 0.2 would end past 0.3 s
        asyncio.run(RetryPolicy(base_s=0.05, max_s=1.0, deadline_s=0.3).run(failing))
    assert err.value.attempts == len(calls) == 3 and err.value.spent_s < 0.3


def test_success_returns_and_other_errors_are_not_retried():
    calls = []

    async def flaky():
        calls.append(1)
        if len(calls) == 1:
            raise Retryable("once")
        if len(calls) == 2:
            return "answer"

    assert asyncio.run(RetryPolicy(base_s=0.0, max_s=1.0, attempts=5).run(flaky)) == "answer"

    async def wrong():
        calls.append(1)
        raise ValueError("bad request")

    calls.clear()
    with pytest.raises(ValueError, match="bad request"):
        asyncio.run(RetryPolicy(base_s=0.0, max_s=1.0, attempts=5).run(wrong))
    assert len(calls) == 1


# ----------------------------------------------------------------------------- both clients over HTTP


@contextlib.contextmanager
def busy_server(retry_afters: list):
    """A real HTTP server on 127.0.0.1: each POST gets 503 with the next ``Retry-After`` of
    ``retry_afters`` (a string, or a function making one when the answer is sent), then 200 with a chat
    completion. Yields (base URL, the arrival time of every request)."""
    script, arrivals = list(retry_afters), []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            arrivals.append(time.monotonic())
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            status, body = (503, {"detail": "busy"}) if script else (200, CHAT_ANSWER)
            self.send_response(status)
            if script:
                value = script.pop(0)
                self.send_header("Retry-After", value() if callable(value) else value)
            data = json.dumps(body).encode()
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", arrivals
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


async def json_call(url: str) -> str:
    client = AsyncJsonClient(url, None, 5.0, 30.0, 0.2)  # backoff 0.2, 0.4, ... capped at 1.6
    try:
        return (await client.post("/chat/completions", {"messages": []}))["choices"][0]["message"]["content"]
    finally:
        await client.aclose()


async def chat_call(url: str) -> str:
    cfg = EndpointConfig(base_url=url, model="m", timeout_s=5.0, retries=3, backoff_s=0.2, max_backoff_s=1.6)
    endpoint = ChatEndpoint("busy", cfg)
    try:
        return (await endpoint.chat([{"role": "user", "content": "hi"}])).text
    finally:
        await endpoint.aclose()


CLIENTS = {"json": (json_call, 1.0), "chat": (chat_call, 0.5)}  # the call, the least jitter factor


@pytest.mark.parametrize("client", list(CLIENTS))
def test_garbage_retry_after_falls_back_to_the_backoff(client):
    call, least = CLIENTS[client]
    with busy_server(["soon", "soon"]) as (url, arrivals):
        assert asyncio.run(call(url)) == "ok"
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    assert len(arrivals) == 3, arrivals
    assert gaps[0] >= 0.2 * least - 0.01 and gaps[1] >= 0.4 * least - 0.01, gaps  # backoff(1), backoff(2)
    assert max(gaps) < 1.0, gaps


@pytest.mark.parametrize("client", list(CLIENTS))
def test_negative_retry_after_backs_off_and_a_date_is_honoured(client):
    call, least = CLIENTS[client]
    in_two_seconds = lambda: formatdate(time.time() + 2, usegmt=True)  # noqa: E731  (whole seconds: 1..2 s)
    with busy_server(["-1", in_two_seconds]) as (url, arrivals):
        assert asyncio.run(call(url)) == "ok"
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    assert len(arrivals) == 3, arrivals
    assert gaps[0] >= 0.2 * least - 0.01, gaps  # the backoff, not an immediate retry
    assert 0.9 <= gaps[1] <= 1.8, gaps  # the date (capped at 1.6 s), not backoff(2) = 0.4 s
