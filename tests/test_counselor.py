"""The counselor API driven by the official ``openai`` client against a real ``escrag serve counselor``
process (tiny random policy, a real retriever process over a 40-chunk ESConv index): non-streaming and
SSE streaming give the same seeded reply, the ``escrag`` field carries think/initial/exemplars/risk, a
high-risk conversation gets ``risk: high`` with reasons and a safety reply (tests/test_counselor_safety.py
covers every category), bad requests get a 422
with a detail, ``--no-rag`` without a retriever is a clear CLI error; ``--endpoint`` mode runs the same
two-stage path over a remote OpenAI-compatible model (the scripted double of tests/openai_double.py);
hostile input (lone surrogates, a multi-megabyte message, a chunked body past the limit) gets a 4xx
at once from all three kinds of server; a 20 MB body reaches every common client as its 413 (issue 55); ``rollout.episode.answer`` runs in-process on the same retriever.
A real reply, its stream and ``/v1/models`` validate against the response models of
``rollout.counselor.protocol``, which the OpenAPI schema of ``build_app`` names.
Run: .venv/bin/python -m pytest -q tests/test_counselor.py"""

import asyncio
import json
import subprocess
import sys
import time
import urllib.parse

import httpx
import openai
import pytest

from escrag.config import load_config
from escrag.data import load_states
from escrag.errors import UserError
from escrag.web.procs import ServerProcess

ARGS = ["-o", "rollout.max_new_tokens_stage1=8", "-o", "rollout.max_new_tokens_stage2=12",
        "-o", "retriever.k=2", "-o", "rollout.torch_threads=1"]
CRISIS = "I've decided to end my life tonight. I already have the pills ready."


@pytest.fixture(scope="module")
def urls(tmp_path_factory, tiny_model, safety_cache, esconv_index):
    """Retriever and counselor processes, started once for this module side by side (the counselor
    reaches its retriever at the first request)."""
    tmp = tmp_path_factory.mktemp("counselor")
    servers = []
    try:
        servers.append(ServerProcess("retriever", ["retriever", "--index", str(esconv_index)], tmp, None))
        rurl = servers[-1].url
        servers.append(ServerProcess("counselor", ["counselor", "--policy", tiny_model, "--retriever", rurl,
                                                   "--config", "configs/cpu-test.yaml", *ARGS], tmp, None))
        yield {name: s.wait(180).url for name, s in zip(("retriever", "counselor"), servers)}
    finally:
        for s in servers:
            s.stop()


@pytest.fixture(scope="module")
def client(urls):
    return openai.OpenAI(base_url=f"{urls['counselor']}/v1", api_key="unused", max_retries=0)


MESSAGES = [{"role": "user", "content": "I failed my driving test again and I feel stupid."},
            {"role": "assistant", "content": "That sounds really frustrating."},
            {"role": "user", "content": "Yes, everyone else passed on the first try."}]


def test_chat_completion_and_stream_agree(client):
    resp = client.chat.completions.create(model="counselor", messages=MESSAGES, seed=11, temperature=1.0)
    assert resp.object == "chat.completion" and resp.choices[0].message.role == "assistant"
    reply = resp.choices[0].message.content
    extra = resp.model_extra["escrag"]
    assert set(extra) >= {"think", "initial", "exemplars", "risk", "reasons", "output"}
    assert extra["risk"] == "none" and len(extra["exemplars"]) == 2
    assert {"id", "history", "response"} <= set(extra["exemplars"][0])
    assert resp.usage.completion_tokens > 0 and resp.choices[0].finish_reason in ("stop", "length")
    chunks = list(client.chat.completions.create(model="counselor", messages=MESSAGES, seed=11,
                                                 temperature=1.0, stream=True))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert streamed == reply
    assert chunks[-1].choices[0].finish_reason == resp.choices[0].finish_reason
    assert chunks[-1].model_extra["escrag"]["output"] == extra["output"]


def test_high_risk_conversation(client):
    msgs = [{"role": "user", "content": "Work has been awful."},
            {"role": "assistant", "content": "I'm sorry, tell me more."},
            {"role": "user", "content": CRISIS}]
    resp = client.chat.completions.create(model="counselor", messages=msgs, temperature=0.0)
    extra = resp.model_extra["escrag"]
    assert extra["risk"] == "high" and extra["reasons"] and "suicide" in extra["categories"]
    text = resp.choices[0].message.content
    assert "crisis line" in text and "emergency services" in text  # safety.locale: international
    chunks = list(client.chat.completions.create(model="counselor", messages=msgs, temperature=0.0,
                                                 stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == text
    assert chunks[-1].model_extra["escrag"]["risk"] == "high"


def test_bad_requests_get_422_with_detail(client):
    with pytest.raises(openai.UnprocessableEntityError) as err:
        client.chat.completions.create(model="c", messages=[{"role": "assistant", "content": "hi"}])
    assert "last message must have role 'user'" in err.value.response.json()["detail"]
    with pytest.raises(openai.UnprocessableEntityError) as err:
        client.chat.completions.create(model="c", messages=MESSAGES, n=2)
    assert "n=1" in err.value.response.json()["detail"]


def test_retrieval_k_per_request(client):
    """``retrieval_k`` (ours) sets a request's exemplar count over the server's ``retriever.k`` (2 here):
    the same seeded stage 1 retrieves the same best exemplars first; out of 1..50 it is a 422."""
    def exemplars(**extra):
        resp = client.chat.completions.create(model="c", messages=MESSAGES, seed=5, temperature=1.0, **extra)
        return [e["id"] for e in resp.model_extra["escrag"]["exemplars"]]

    two, three, one = exemplars(), exemplars(extra_body={"retrieval_k": 3}), exemplars(extra_body={"retrieval_k": 1})
    assert len(two) == 2 and len(three) == 3 and three[:2] == two and one == two[:1]
    for bad in (0, 51, "x"):
        with pytest.raises(openai.UnprocessableEntityError):
            exemplars(extra_body={"retrieval_k": bad})


def test_no_retriever_is_a_cli_error(tiny_model):
    proc = subprocess.run([sys.executable, "-m", "escrag", "serve", "counselor", "--policy", tiny_model],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--retriever URL is required unless --no-rag" in proc.stderr


def test_answer_in_process(urls, tiny_model):
    from retriever_server.client import RetrieverClient
    from rollout.engines.hf_engine import HFEngine
    from rollout.episode import answer, engine_chat

    cfg = load_config("configs/cpu-test.yaml", [a for a in ARGS if a != "-o"])
    chat = engine_chat(HFEngine(tiny_model, cfg.rollout), cfg)
    state = load_states("test")[0]
    ans = asyncio.run(answer(state.history, chat, RetrieverClient(urls["retriever"]), cfg, seed=3))
    assert {"response", "think", "initial", "initial_output", "exemplars", "output", "query"} <= set(ans)
    assert len(ans["exemplars"]) == 2 and ans["initial_output"]
    again = asyncio.run(answer(state.history, chat, RetrieverClient(urls["retriever"]), cfg, seed=3))
    assert again["output"] == ans["output"]  # seeded
    one = asyncio.run(answer(state.history, chat, None, cfg, rag=False, seed=3))
    assert one["exemplars"] == [] and one["initial"] == "" and one["output"] == ans["initial_output"]


def test_exemplars_that_overflow_the_context_are_dropped_not_a_400(urls, tiny_model):
    """Long retrieved chunks can push the stage-2 prompt past the engine's context although the
    client's conversation fits (the load benchmark's counselor got a 400 on a good request): the
    last-ranked exemplars are dropped until it fits, and the answer names those shown."""
    from retriever_server.client import RetrieverClient
    from rollout.engines.hf_engine import HFEngine
    from rollout.episode import answer, engine_chat, prompt_ids, stage2_messages

    cfg = load_config("configs/cpu-test.yaml", [a for a in ARGS if a != "-o"])
    engine, state = HFEngine(tiny_model, cfg.rollout), load_states("test")[0]
    full = asyncio.run(answer(state.history, engine_chat(engine, cfg), RetrieverClient(urls["retriever"]), cfg, seed=3))
    shown = full["exemplars"]
    one = len(prompt_ids(engine.tokenizer, stage2_messages(state.history, full["initial_output"], shown[:1], cfg)))
    two = len(prompt_ids(engine.tokenizer, stage2_messages(state.history, full["initial_output"], shown, cfg)))
    assert len(shown) == 2 and two > one + 8
    tight = load_config("configs/cpu-test.yaml", [a for a in ARGS if a != "-o"] + [f"rollout.max_seq_len={one + 8}"])
    ans = asyncio.run(answer(state.history, engine_chat(HFEngine(tiny_model, tight.rollout), tight),
                             RetrieverClient(urls["retriever"]), tight, seed=3))
    assert ans["initial_output"] == full["initial_output"] and ans["exemplars"] == shown[:1]


def test_endpoint_mode_runs_the_two_stage_path_over_a_remote_model(urls, tmp_path):
    """A remote OpenAI-compatible model (the scripted double) behind ``--endpoint``: stage 1 answers
    the client, stage 2 sees ĉ as its own turn and the exemplars, and the reply is stage 2's."""
    from openai_double import OpenAIDouble, Reply

    with OpenAIDouble() as llm:
        llm.on("stage2", r"## Exemplars", default=Reply(content="<think>use them</think><response>Final.</response>"),
               match="last")
        llm.on("stage1", r"everyone else passed", default=Reply(content="<think>t</think><response>Draft.</response>"),
               match="last")
        server = ServerProcess("endpoint", ["counselor", "--endpoint", llm.base_url, "--endpoint-model", "gpt-x",
                                            "--retriever", urls["retriever"], "--config", "configs/cpu-test.yaml",
                                            *ARGS], tmp_path)
        try:
            client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
            resp = client.chat.completions.create(model="gpt-x", messages=MESSAGES, seed=5)
        finally:
            server.stop()
        assert resp.choices[0].message.content == "Final."
        extra = resp.model_extra["escrag"]
        assert extra["initial"] == "Draft." and len(extra["exemplars"]) == 2 and extra["format_ok"]
        assert llm.calls["stage1"] == 1 and llm.calls["stage2"] == 1
        second = [c for c in llm.requests if c.key == "stage2"][0].body
        assert second["model"] == "gpt-x" and "seed" in second and "stop" not in second
        assert second["messages"][-2] == {"role": "assistant", "content": "<think>t</think><response>Draft.</response>"}
        assert extra["exemplars"][0]["response"] in second["messages"][-1]["content"]


SURROGATE = b'"I feel \\ud83d alone"'  # a lone high surrogate, escaped as JSON allows


def test_hostile_input_gets_4xx_at_once(urls, serve):
    reward = serve(["reward", "--rule", "length:3"])
    cases = [(f"{urls['counselor']}/v1/chat/completions", b'{"messages": [{"role": "user", "content": ' + SURROGATE + b"}]}"),
             (f"{urls['retriever']}/retrieve", b'{"queries": [' + SURROGATE + b"]}"),
             (f"{reward}/score", b'{"items": [{"history": [{"role": "user", "content": "hi"}], "output": ' + SURROGATE + b"}]}")]
    for url, body in cases:
        r = httpx.post(url, content=body, headers={"content-type": "application/json"}, timeout=30)
        assert r.status_code == 400 and "malformed Unicode" in r.json()["detail"], (url, r.text)
    big = {"messages": [{"role": "user", "content": "I am so tired. " * 200_000}]}  # 3 MB
    start = time.perf_counter()
    r = httpx.post(f"{urls['counselor']}/v1/chat/completions", json=big, timeout=60)
    assert r.status_code == 413 and time.perf_counter() - start < 5
    long = {"messages": [{"role": "user", "content": "I am so tired. " * 8_000}]}  # under 1 MiB, too long
    r = httpx.post(f"{urls['counselor']}/v1/chat/completions", json=long, timeout=60)
    assert r.status_code == 400 and "counselor.max_history_chars" in r.json()["detail"]

    def chunks():  # a chunked upload has no content-length for the guard to check
        for _ in range(40):
            yield b"x" * 262_144
    r = httpx.post(f"{urls['counselor']}/v1/chat/completions", content=chunks(), timeout=60)
    assert r.status_code == 413


BIG = 20 * 1024 * 1024  # past every server's limit, within the bound a guard reads and discards


def _pieces(body: bytes, size: int = 256 * 1024):
    return (body[i:i + size] for i in range(0, len(body), size))


def _send_whole(url: str, path: str, body: bytes, how: str) -> tuple[int, dict]:
    """POST ``body`` whole with one client, then read the answer: (status, JSON body)."""
    import http.client
    import urllib.request

    import requests

    parts, headers = urllib.parse.urlsplit(url), {"content-type": "application/json"}
    if how.startswith("http.client"):
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
        if how.endswith("close"):
            headers["connection"] = "close"
        if how.endswith("chunked"):
            conn.request("POST", path, body=_pieces(body), headers=headers, encode_chunked=True)
        else:
            conn.request("POST", path, body=body, headers=headers)
        resp = conn.getresponse()
        status, answer = resp.status, json.loads(resp.read())
        if how == "http.client":  # keep-alive: the connection still serves the next request
            conn.request("GET", "/health")
            assert conn.getresponse().status == 200, "the connection did not survive its 413"
        conn.close()
        return status, answer
    if how == "urllib":  # sends Connection: close
        try:
            with urllib.request.urlopen(urllib.request.Request(url + path, data=body, headers=headers), timeout=60):
                raise AssertionError("no 413")
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())
    if how == "requests":
        r = requests.post(url + path, data=body, headers=headers, timeout=60)
        return r.status_code, r.json()
    r = httpx.post(url + path, headers=headers, timeout=60, content=_pieces(body) if how == "httpx chunked" else body)
    return r.status_code, r.json()


def test_a_body_past_the_limit_gets_its_413_through_every_client(urls, serve):
    """20 MB sent whole, by length and chunked, through the standard library (keep-alive and
    ``Connection: close``), urllib, requests, httpx and the openai package: every server answers 413
    with JSON naming its limit, and the client reads it (a guard that answers before reading the body
    lets the server close on a client still sending: a reset, not a 413)."""
    reward = serve(["reward", "--rule", "length:3"])
    cfg, test = load_config(), load_config("configs/cpu-test.yaml").counselor.max_body_bytes
    body = b'{"queries": ["' + b"a" * BIG + b'"]}'
    clients = ("http.client", "http.client close", "http.client chunked", "urllib", "requests", "httpx",
               "httpx chunked")
    for url, path, limit in ((urls["retriever"], "/retrieve", cfg.retriever.max_body_bytes),
                             (reward, "/score", cfg.reward.max_body_bytes), (reward, "/get_reward", cfg.reward.max_body_bytes),
                             (urls["counselor"], "/v1/chat/completions", test)):
        for how in clients:
            status, answer = _send_whole(url, path, body, how)
            assert status == 413 and answer == {"detail": f"request body larger than {limit} bytes"}, (path, how)
    client = openai.OpenAI(base_url=f"{urls['counselor']}/v1", api_key="unused", max_retries=0, timeout=60)
    with pytest.raises(openai.APIStatusError) as err:
        client.chat.completions.create(model="c", messages=[{"role": "user", "content": "a" * BIG}])
    assert err.value.status_code == 413 and f"larger than {test} bytes" in err.value.response.json()["detail"]
    keyed = serve(["reward", "--rule", "length:3", "--api-key", "k"])  # no token: its 401 arrives the same way
    assert _send_whole(keyed, "/score", body, "urllib") == (401, {"detail": "missing or wrong bearer token"})


def _raw(url: str, head: bytes) -> bytes:
    """Send a request head alone over a socket and return everything the server sends until it closes."""
    import socket

    parts = urllib.parse.urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
        sock.sendall(head)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


def test_a_body_it_will_not_read_is_refused_at_once_and_the_connection_closed(urls):
    """Past the bound a guard reads (``escrag.web.serving.DRAIN_BYTES``), or with ``Expect:
    100-continue`` (the client waits before sending), the 413 goes out at once, without a body read,
    and the server closes after it: no 100 Continue, no wait for bytes that may never come."""
    from escrag.web.serving import DRAIN_BYTES

    for extra in (f"content-length: {DRAIN_BYTES + 1}", f"content-length: {BIG}\r\nexpect: 100-continue"):
        head = f"POST /retrieve HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n{extra}\r\n\r\n"
        answer = _raw(urls["retriever"], head.encode()).decode()
        assert answer.startswith("HTTP/1.1 413") and "connection: close" in answer.lower(), answer
        assert "100 Continue" not in answer and answer.endswith("bytes\"}"), answer


def test_replies_validate_against_the_response_models(urls, tiny_model):
    from rollout.counselor.protocol import ChatCompletionChunk, ChatCompletionResponse, ModelList

    base, body = urls["counselor"], {"model": "c", "messages": MESSAGES, "seed": 11, "temperature": 1.0}
    r = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=120)
    resp = ChatCompletionResponse.model_validate(r.raise_for_status().json())
    assert resp.model_dump(mode="json") == r.json()  # the model holds every key the server sent
    assert resp.escrag.risk == "none" and len(resp.escrag.exemplars) == 2
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens
    with httpx.stream("POST", f"{base}/v1/chat/completions", json={**body, "stream": True}, timeout=120) as s:
        events = [line[len("data: "):] for line in s.iter_lines() if line]
    assert events[-1] == "[DONE]"
    chunks = [ChatCompletionChunk.model_validate_json(e) for e in events[:-1]]
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == resp.choices[0].message.content
    assert [c.escrag is not None for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert chunks[-1].escrag == resp.escrag
    models = ModelList.model_validate(httpx.get(f"{base}/v1/models", timeout=30).json())
    assert [m.id for m in models.data] == [tiny_model]  # --policy names the model


def test_openapi_names_the_response_models():
    from types import SimpleNamespace

    from rollout.counselor.server import build_app

    stub = SimpleNamespace(cfg=load_config("configs/cpu-test.yaml"), health=dict, guard=None)  # routes are not called
    paths = build_app(stub).openapi()["paths"]

    def schema(path, method):
        return paths[path][method]["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]

    assert schema("/v1/chat/completions", "post") == "#/components/schemas/ChatCompletionResponse"
    assert schema("/v1/models", "get") == "#/components/schemas/ModelList"


def test_safety_comes_first_and_no_model_text_leaks(safety_cache):
    """In-process service over a remote model (the scripted double): a high-risk conversation gets the
    safety reply with nothing generated (the model is never called) and no model text in the response;
    a reply that itself reads as high risk (here a policy echoing a client's plan in the first person)
    is replaced the same way. The check reads the reply as one more client turn, so a second-person
    instruction ("you could take ...") comes out elevated, not high: a known gap (docs/safety.md)."""
    import dataclasses

    from openai_double import OpenAIDouble, Reply

    from escrag.llm.endpoint import ChatEndpoint
    from escrag.safety.classifier import RiskClassifier
    from rollout.counselor.protocol import ChatCompletionRequest
    from rollout.counselor.service import CounselorService

    cfg = load_config("configs/cpu-test.yaml")
    harmful = "<think>secret plan</think><response>I've saved 40 pills and I'm taking them all tonight.</response>"
    with OpenAIDouble() as llm:
        llm.on("driving", "driving test", default=Reply(content=harmful), match="last")
        llm.on("crisis", "pills ready", default=Reply(content="<think>t</think><response>MODEL TEXT</response>"))
        ecfg = dataclasses.replace(cfg.counselor.endpoint, base_url=llm.base_url, model="gpt-x")
        service = CounselorService(cfg, RiskClassifier.from_config(cfg), endpoint=ChatEndpoint("counselor", ecfg))

        def respond(messages):
            return asyncio.run(service.respond(ChatCompletionRequest(model="gpt-x", messages=messages)))

        crisis = respond([{"role": "user", "content": CRISIS}])
        assert llm.calls["crisis"] == 0  # assessed first: nothing generated
        assert crisis.escrag.risk == "high" and "crisis line" in crisis.text
        assert (crisis.escrag.output, crisis.escrag.think, crisis.escrag.initial) == ("", "", "")
        assert "MODEL TEXT" not in crisis.model_dump_json()
        bad = respond([{"role": "user", "content": "I failed my driving test again and I feel stupid."}])
        assert llm.calls["driving"] == 1 and bad.escrag.risk == "high" and "crisis line" in bad.text
        assert "pills" not in bad.model_dump_json() and "secret plan" not in bad.model_dump_json()
        assert "withheld" in bad.escrag.reasons[0]
        no_rag = ChatCompletionRequest(model="gpt-x", messages=[{"role": "user", "content": "hi"}], retrieval_k=2)
        with pytest.raises(UserError, match="retrieval_k: this counselor answers without retrieval"):
            asyncio.run(service.respond(no_rag))  # a 400 over HTTP (escrag.web.serving)


def _post(base, body, stream=False):
    """(status, reply text or error detail, risk or None) of one request, streamed or not."""
    if not stream:
        r = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=300)
        if r.status_code != 200:
            return r.status_code, r.json()["detail"], None
        return 200, r.json()["choices"][0]["message"]["content"], r.json()["escrag"]["risk"]
    with httpx.stream("POST", f"{base}/v1/chat/completions", json={**body, "stream": True}, timeout=300) as s:
        s.read()
        if s.status_code != 200:
            return s.status_code, s.json()["detail"], None
        events = [json.loads(line[6:]) for line in s.iter_lines() if line and line != "data: [DONE]"]
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events)
    return 200, text, events[-1]["escrag"]["risk"]


def test_over_long_conversations_get_400_unless_in_crisis(urls):
    """Past the engine's context (rollout.max_seq_len 1024 in cpu-test) a conversation gets 400 in
    vLLM's words, not a 500. A crisis in a conversation past either limit still gets the safety reply
    (the check comes first; past counselor.max_history_chars on the last characters within it), and
    streaming answers the same, with the crisis before or after a long turn (after it, the
    conversation head's average had vetoed it: safety.conv_veto_max_turn_chars)."""
    base, tired = urls["counselor"], "I am so tired of everything at work. " * 160  # ~1,600 tokens
    calm = [{"role": "user", "content": tired}]
    listening = {"role": "assistant", "content": "I'm listening."}
    first, last = [{"role": "user", "content": CRISIS}, listening, *calm], [*calm, listening, {"role": "user", "content": CRISIS}]
    huge = [{"role": "user", "content": CRISIS * 1_500}]  # ~102,000 characters: its last 100,000 are read
    for stream in (False, True):
        status, detail, _ = _post(base, {"messages": calm}, stream)
        assert status == 400 and "maximum context length is 1024 tokens" in detail, (status, detail)
        for messages in (first, last, huge):
            status, text, risk = _post(base, {"messages": messages}, stream)
            assert status == 200 and risk == "high" and "crisis line" in text, (status, text)


def test_numbers_out_of_range_are_4xx_on_all_three_servers(urls, serve):
    """NaN, Infinity and huge values in numeric fields: 4xx with a detail, never a 5xx."""
    reward = serve(["reward", "--rule", "length:3"])
    msg = '{"messages": [{"role": "user", "content": "hi"}], '
    cases = [(f"{urls['counselor']}/v1/chat/completions", msg + '"temperature": NaN}'),
             (f"{urls['counselor']}/v1/chat/completions", msg + '"top_p": Infinity}'),
             (f"{urls['counselor']}/v1/chat/completions", msg + '"max_tokens": 1e400}'),
             (f"{urls['counselor']}/v1/chat/completions", msg + '"max_tokens": 99999999999999999999}'),
             (f"{urls['retriever']}/retrieve", '{"queries": ["hi"], "k": NaN}'),
             (f"{urls['retriever']}/retrieve", '{"queries": ["hi"], "k": 10000000000000000000000}'),
             (f"{reward}/score", '{"items": [{"history": [{"role": "user", "content": "hi"}], "output": NaN}]}')]
    for url, body in cases:
        r = httpx.post(url, content=body.encode(), headers={"content-type": "application/json"}, timeout=60)
        assert 400 <= r.status_code < 500 and r.json()["detail"], (url, body, r.status_code, r.text[:300])


def test_queue_is_bounded_and_the_risk_check_leaves_the_loop_free(tmp_path, safety_cache):
    """counselor.max_queue=1 over a slow remote model (the scripted double): a second request while one
    is in progress gets 503 with Retry-After; while the first one's risk check reads ~99,000 characters
    (about a second), /health still answers at once (the check runs off the event loop)."""
    from concurrent.futures import ThreadPoolExecutor

    from openai_double import OpenAIDouble, Reply

    slow = Reply(content="<think>t</think><response>I hear you.</response>", delay_s=4)
    with OpenAIDouble().on("any", r".", default=slow) as llm:
        server = ServerProcess("counselor", ["counselor", "--endpoint", llm.base_url, "--endpoint-model", "m",
                                             "--no-rag", "--config", "configs/cpu-test.yaml",
                                             "-o", "counselor.max_queue=1", "-o", "counselor.retry_after_s=3"],
                               tmp_path, timeout=600)
        try:
            url = f"{server.url}/v1/chat/completions"
            long = {"messages": [{"role": "user", "content": "Work was long and my feet hurt a lot. " * 2_500}]}
            with ThreadPoolExecutor(1) as pool:
                first = pool.submit(httpx.post, url, json=long, timeout=300)
                time.sleep(0.3)
                health, refused = [], 0
                while not first.done() and len(health) < 20:
                    t0 = time.perf_counter()
                    httpx.get(f"{server.url}/health", timeout=30).raise_for_status()
                    health.append(time.perf_counter() - t0)
                    busy = httpx.post(url, json={"messages": MESSAGES}, timeout=30)
                    if busy.status_code == 200 and first.done():  # the first ended between the two checks
                        break
                    assert busy.status_code == 503 and busy.headers["retry-after"] == "3", busy.text
                    refused += 1
                    time.sleep(0.2)
                assert first.result().status_code == 200, first.result().text
            assert refused, "no request was refused while the first was in progress"
            assert health and max(health) < 1.0, health
        finally:
            server.stop()
