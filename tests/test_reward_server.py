"""Reward service, app and client: rule scorers; the service adds the format reward and scores the
<response> text; the in-process app answers bad input with 4xx + detail, a full queue with 503 +
Retry-After, a missing token with 401; a real `escrag serve reward --rm` process on a socket returns the
same scores as the model in-process, coalesces concurrent one-item requests, counts truncations in
/metrics, serves OpenRLHF's /get_reward; a real `--rule` server serves a rule; the client retries and
fails clearly.
Run: .venv/bin/python -m pytest -q tests/test_reward_server.py"""

import asyncio
import threading

import httpx
import pytest

from escrag.config import RewardConfig
from escrag.errors import UserError
from escrag.web.client import ServiceError
from reward_server.client import RewardClient
from reward_server.protocol import prompt_history
from reward_server.rules import parse_rule
from reward_server.server import build_app
from reward_server.service import RewardService

GOOD = "<think>The client feels alone.</think><response>Hello, hello friend. I am here.</response>"
HIST = [{"role": "user", "content": "I feel alone."}]


def test_rules():
    kw = parse_rule("keyword:Hello")
    assert kw(HIST, "hello, HELLO world!") == pytest.approx(2 / 3)
    assert kw(HIST, "") == 0.0 and kw(HIST, "goodbye") == 0.0
    ln = parse_rule("length:4")
    assert ln(HIST, "a b c d") == 1.0 and ln(HIST, "a b") == 0.5 and ln(HIST, "a " * 20) == 0.0
    for bad, msg in (("nope:1", "unknown rule 'nope'"), ("keyword", "needs one word"),
                     ("keyword:two words", "needs one word"), ("length:0", "positive word count"),
                     ("length:x", "positive word count")):
        with pytest.raises(UserError, match=msg):
            parse_rule(bad)


def test_service_adds_format_reward_and_scores_response_text():
    service = RewardService.from_rule("keyword:hello", RewardConfig())
    items = [{"history": HIST, "output": GOOD}, {"history": HIST, "output": "hello hello"}]
    out = asyncio.run(service.score(items))
    assert out["format_rewards"] == [1.0, 0.0]
    assert out["rm_scores"] == pytest.approx([2 / 6, 1.0])  # inside <response> / whole unparsed output
    assert out["rewards"] == pytest.approx([1 + 2 / 6, 1.0])
    prompt = ("<|im_start|>system\nexemplars...<|im_end|>\n<|im_start|>user\nI feel alone.<|im_end|>\n"
              "<|im_start|>assistant\n")
    assert prompt_history(prompt) == HIST
    got = asyncio.run(service.get_reward([prompt + GOOD + "<|im_end|>"], [prompt]))
    assert got["rewards"] == got["scores"] == pytest.approx([1 + 2 / 6])
    assert got["extra_logs"] == {"rm_scores": pytest.approx([2 / 6]), "format_rewards": [1.0]}


def _asgi(app):
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://reward")


BAD_SCORE = [
    ({"items": []}, "items"),
    ({"items": [{"history": HIST}]}, "items.0.output"),
    ({"items": [{"history": [], "output": "x"}]}, "items.0.history"),
    ({"items": [{"history": [{"role": "system", "content": "x"}], "output": "x"}]}, "role"),
    ({"items": [{"history": [{"role": "assistant", "content": "x"}], "output": "x"}]}, "end with a user"),
    ({"items": [{"history": HIST, "output": 3}]}, "output"),
    ({"items": [{"history": HIST, "output": "x", "extra": 1}]}, "extra"),
    ({"queries": ["x"]}, "items"),
]
BAD_GET_REWARD = [
    ({"query": ["abc"]}, "prompts is required"),
    ({"query": ["abc"], "prompts": ["a", "b"]}, "1 queries but 2 prompts"),
    ({"query": ["abc"], "prompts": ["x"]}, "query[0] does not start with prompts[0]"),
    ({"query": []}, "query"),
]


def test_in_process_app_rejects_bad_input_with_4xx_detail():
    app = build_app(RewardService.from_rule("keyword:hello", RewardConfig(max_queue=4, max_body_bytes=4096)))

    async def main():
        async with _asgi(app) as c:
            for path, cases in (("/score", BAD_SCORE), ("/get_reward", BAD_GET_REWARD)):
                for body, needle in cases:
                    r = await c.post(path, json=body)
                    assert r.status_code == 422 and needle in r.json()["detail"], (path, body, r.text)
            r = await c.post("/score", content=b"{not json", headers={"content-type": "application/json"})
            assert r.status_code == 422 and "detail" in r.json()
            r = await c.post("/score", json={"items": [{"history": HIST, "output": "x"}] * 5})
            assert r.status_code == 400 and "queue limit of 4" in r.json()["detail"]
            r = await c.post("/score", json={"items": [{"history": HIST, "output": "x" * 5000}]})
            assert r.status_code == 413
            r = await c.post("/score", json={"items": [{"history": HIST, "output": GOOD}]})
            assert r.status_code == 200 and r.json()["format_rewards"] == [1.0]

    asyncio.run(main())


def test_full_queue_answers_503_with_retry_after_and_token_is_required():
    gate = threading.Event()
    rule = parse_rule("length:3")

    def gated(items):  # the length rule, held until the test opens the gate: a batch stays in flight
        gate.wait(60)
        return [rule(h, t) for h, t in items], [False] * len(items)

    service = RewardService(gated, "gated:length:3", RewardConfig(max_queue=4, max_batch=64, max_wait_ms=0))
    app = build_app(service, api_key="sekrit")
    auth = {"Authorization": "Bearer sekrit"}

    async def main():
        async with _asgi(app) as c:
            assert (await c.post("/score", json={"items": []})).status_code == 401
            assert (await c.post("/score", json={"items": []}, headers={"Authorization": "Bearer no"})).status_code == 401
            assert (await c.get("/health")).status_code == 200  # health stays open
            first = asyncio.create_task(c.post("/score", json={"items": [{"history": HIST, "output": "a b c"}] * 4},
                                               headers=auth))
            while service.batcher.pending < 4:  # wait for the condition, not for a window
                await asyncio.sleep(0.01)
            second = await c.post("/score", json={"items": [{"history": HIST, "output": "a"}]}, headers=auth)
            assert second.status_code == 503 and second.headers["retry-after"] == "1"
            assert "overloaded" in second.json()["detail"]
            gate.set()
            assert (await first).json()["rm_scores"] == [1.0] * 4
            metrics = (await c.get("/metrics")).text
            assert "escrag_reward_queue_full_total 1.0" in metrics

    asyncio.run(main())


@pytest.fixture(scope="module")
def head_dir(tmp_path_factory):
    """A seeded random head on the tiny backbone: serving does not care how the head was trained."""
    import torch
    from transformers import AutoConfig

    from escrag.models import resolve_model
    from reward_server.model import backbone_fingerprint, save_head

    hidden = AutoConfig.from_pretrained(resolve_model("tiny-random:qwen2")).hidden_size
    weight = torch.randn(hidden, generator=torch.Generator().manual_seed(0))
    manifest = {"backbone": "tiny-random:qwen2", "backbone_fingerprint": backbone_fingerprint("tiny-random:qwen2", "float32"),
                "dtype": "float32", "max_length": 64, "max_history_turns": None}
    return save_head(tmp_path_factory.mktemp("rm") / "head", weight, 0.1, manifest)


def test_real_rm_server_over_socket(serve, head_dir):
    from reward_server.model import RewardModel

    url = serve(["reward", "--rm", str(head_dir), "--config", "configs/cpu-test.yaml",
                 "-o", "reward.max_wait_ms=100", "--api-key", "sekrit"])
    long_hist = [{"role": "user", "content": "I cannot sleep and I keep worrying about work. " * 12}]
    items = [{"history": HIST, "output": GOOD}, {"history": HIST, "output": "no tags here"},
             {"history": long_hist, "output": GOOD}]
    rm = RewardModel.load(head_dir)
    expected, truncated = rm.score([(it["history"], t) for it, t in zip(items, ["Hello, hello friend. I am here.",
                                                                               "no tags here", "Hello, hello friend. I am here."])])
    assert truncated == [False, False, True]

    async def main():
        client = RewardClient(url, api_key="sekrit")
        try:
            out = await client.score(items)
            singles = await asyncio.gather(*(client.score([items[i % 2]]) for i in range(16)))
            health = await client.health()
        finally:
            await client.aclose()
        return out, singles, health

    out, singles, health = asyncio.run(main())
    assert out["rm_scores"] == pytest.approx(expected, abs=1e-4)
    assert out["format_rewards"] == [1.0, 0.0, 1.0]
    assert out["rewards"] == pytest.approx([expected[0] + 1, expected[1], expected[2] + 1], abs=1e-4)
    assert [s["rm_scores"][0] for s in singles] == pytest.approx([expected[i % 2] for i in range(16)], abs=1e-4)
    assert health["scorer"] == "rm" and health["items"] == 19  # coalescing: tests/test_batching.py
    assert health["truncations"] == 1

    auth = {"Authorization": "Bearer sekrit"}
    r = httpx.post(f"{url}/score", json={"items": [{"history": HIST}]}, headers=auth)
    assert r.status_code == 422 and "output" in r.json()["detail"]
    assert httpx.post(f"{url}/score", json={"items": items}).status_code == 401
    prompt = rm.backbone.tokenizer.apply_chat_template(HIST, tokenize=False, add_generation_prompt=True)
    r = httpx.post(f"{url}/get_reward", json={"query": [prompt + GOOD + "<|im_end|>"], "prompts": [prompt],
                                              "labels": [None]}, headers=auth)
    assert r.status_code == 200 and r.json()["rewards"] == pytest.approx([expected[0] + 1], abs=1e-4)
    metrics = httpx.get(f"{url}/metrics").text
    assert "escrag_reward_truncations_total 1.0" in metrics and "escrag_reward_batch_size_bucket" in metrics
    assert 'escrag_reward_requests_total{path="/score",status="422"} 1.0' in metrics


def test_rule_server_over_socket_and_cli_errors(serve, capsys):
    from escrag.cli import main

    url = serve(["reward", "--rule", "keyword:hello"])
    r = httpx.post(f"{url}/score", json={"items": [{"history": HIST, "output": GOOD}]})
    assert r.status_code == 200 and r.json()["rm_scores"] == pytest.approx([2 / 6])
    assert httpx.get(f"{url}/health").json()["scorer"] == "rule:keyword:hello"
    assert main(["serve", "reward", "--rule", "bogus:1"]) == 2
    assert "unknown rule 'bogus'" in capsys.readouterr().err
    assert main(["serve", "reward", "--rm", "/nonexistent/rm"]) == 2
    assert "not a reward-model folder" in capsys.readouterr().err


def test_client_fails_clearly(serve):
    from conftest import free_port

    url = serve(["reward", "--rule", "length:3"])

    async def main():
        dead = RewardClient(f"http://127.0.0.1:{free_port()}", RewardConfig(timeout_s=2, wait_s=0.5, backoff_s=0.01))
        with pytest.raises(ServiceError, match=r"127\.0\.0\.1.*/score failed after \d+ attempt"):
            await dead.score([{"history": HIST, "output": "x"}])
        live = RewardClient(url)
        with pytest.raises(ServiceError, match="rejected the request.*422"):
            await live.score([{"history": [], "output": "x"}])
        assert await live.score([]) == {"rewards": [], "rm_scores": [], "format_rewards": []}
        assert (await live.score([{"history": HIST, "output": "a b c"}]))["rm_scores"] == [1.0]
        await live.aclose()
        await dead.aclose()

    asyncio.run(main())


def test_strategy_rule_pays_exactly_one_gold_strategy_over_socket(serve):
    """``strategy:valid`` through a real server: a think block naming exactly one gold label earns 1 (+1
    format), naming it beside another or naming a wrong one earns 0; a history that is no state of
    the split is refused with 400 alone, the valid request coalesced with it still answered."""
    from escrag.data import STRATEGIES, load_states

    state = next(s for s in load_states("valid") if len(s.strategies) == 1)
    gold, wrong = state.strategies[0], next(x for x in STRATEGIES if x not in state.strategies)
    url = serve(["reward", "--rule", "strategy:valid"])
    outputs = [f"<think>Use {gold.lower()}.</think><response>I hear you.</response>",
               f"<think>{gold} or {wrong}.</think><response>I hear you.</response>",
               f"<think>{wrong}.</think><response>I hear you.</response>",
               f"{gold}: no format"]
    r = httpx.post(f"{url}/score", json={"items": [{"history": state.history, "output": o} for o in outputs]})
    assert r.status_code == 200, r.text
    assert r.json()["rm_scores"] == [1.0, 0.0, 0.0, 0.0] and r.json()["rewards"] == [2.0, 1.0, 1.0, 0.0]

    async def both():
        async with httpx.AsyncClient(base_url=url, timeout=30) as c:
            return await asyncio.gather(
                c.post("/score", json={"items": [{"history": [{"role": "user", "content": "Not ESConv."}],
                                                  "output": outputs[0]}]}),
                c.post("/score", json={"items": [{"history": state.history, "output": outputs[0]}]}))

    bad, good = asyncio.run(both())
    assert bad.status_code == 400 and "no dialogue state of ESConv 'valid'" in bad.json()["detail"], bad.text
    assert good.status_code == 200 and good.json()["rm_scores"] == [1.0]
