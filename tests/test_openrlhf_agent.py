"""The OpenRLHF agent (rollout/openrlhf_agent.py) through OpenRLHF 0.11.2's real
``MultiTurnAgentExecutor.execute`` under asyncio, on our transformers engine (tiny random Qwen2) in
vLLM's async shape, against real retriever and reward server processes (a 40-chunk ESConv index and
the ``length:8`` rule reward): for every sample of a group, run concurrently as OpenRLHF runs them,
the token ids, action ranges, loss mask, rollout log-probs and reward parts equal the local episode's
(rollout/episode.py) on the same state and seeds; with ``train_stage1`` both actions are trained; with
``rag: false`` one action is scored; an episode whose context runs out before stage 2 trains nothing
and says so; the label round-trips through OpenRLHF's own ``PromptDataset``.
Run: .venv/bin/python -m pytest -q tests/test_openrlhf_agent.py"""

import asyncio
import importlib.util
import json
import subprocess
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

pytest.importorskip("openrlhf.utils.agent", reason="make install adds the no-deps OpenRLHF these tests use")

from escrag.config import load_config  # noqa: E402
from escrag.data import load_states  # noqa: E402
from escrag.servers import ServerProcess  # noqa: E402
from retriever_server.client import RetrieverClient  # noqa: E402
from reward_server.client import RewardClient  # noqa: E402
from rollout import episode  # noqa: E402
from rollout import openrlhf_agent as agent  # noqa: E402
from rollout.engine import SamplingParams  # noqa: E402
from rollout.hf_engine import HFEngine  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RULE = "length:8"
OVERRIDES = ["rollout.group_size=3", "rollout.temperature=1.0", "rollout.top_k=0", "rollout.max_new_tokens_stage1=12",
             "rollout.max_new_tokens_stage2=12", "retriever.k=2"]


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """A retriever over a 40-chunk ESConv-train index and the rule reward server (real processes)."""
    tmp = tmp_path_factory.mktemp("openrlhf-agent-servers")
    subprocess.run([sys.executable, "-m", "escrag", "index", "build", "--source", "esconv", "--out",
                    str(tmp / "index"), "--limit", "40"], check=True, capture_output=True)
    procs = [ServerProcess("retriever", ["retriever", "--index", str(tmp / "index")], tmp, None),
             ServerProcess("reward", ["reward", "--rule", RULE], tmp, None)]
    try:
        yield {p.name: p.wait(180).url for p in procs}
    finally:
        for p in procs:
            p.stop()


@pytest.fixture(scope="module")
def engine(tiny_model):
    return HFEngine(tiny_model, seed=0)


def _cfg(*extra):
    return load_config(ROOT / "configs" / "cpu-test.yaml", [*OVERRIDES, *extra])


# ------------------------------------------------------------------------------ vLLM's shape


@dataclass
class _Logprob:
    logprob: float


@dataclass
class _Completion:
    token_ids: list
    text: str
    finish_reason: str
    logprobs: list | None


class VLLMShaped:
    """Our transformers engine behind vLLM's ``async generate(token_ids, sampling_params,
    multi_modal_data=None)`` -> RequestOutput-like object, as OpenRLHF's RolloutRayActor offers it.
    Each call uses the next of ``seeds`` (vLLM's per-request seed), so one episode's two calls draw
    what the local episode draws for that sample."""

    def __init__(self, engine: HFEngine, seeds: list[int]):
        self.engine, self.seeds, self.requests = engine, list(seeds), []

    async def generate(self, prompt_token_ids, sampling_params, multi_modal_data=None):
        sp = sampling_params
        assert multi_modal_data is None and sp.include_stop_str_in_output and sp.skip_special_tokens
        params = SamplingParams(sp.max_tokens, sp.temperature, sp.top_p, max(sp.top_k, 0),
                                seed=self.seeds[len(self.requests)], stop_strings=tuple(sp.stop))
        self.requests.append(sp)
        gen = (await asyncio.to_thread(self.engine.generate, [list(prompt_token_ids)], params))[0]
        lps = [{t: _Logprob(lp)} for t, lp in zip(gen.token_ids, gen.logprobs)] if sp.logprobs else None
        return types.SimpleNamespace(outputs=[_Completion(list(gen.token_ids), gen.text, gen.finish_reason, lps)])


def _openrlhf_params(cfg):
    """The sampling params OpenRLHF's SamplesGenerator builds (vLLM SamplingParams' fields)."""
    ro = cfg.rollout
    return types.SimpleNamespace(temperature=ro.temperature, top_p=ro.top_p, top_k=-1, max_tokens=None,
                                 min_tokens=1, skip_special_tokens=False, logprobs=1, stop=None,
                                 include_stop_str_in_output=False)


def _label(state, cfg, servers):
    return agent.episode_label(state, cfg, servers["retriever"], servers["reward"])


async def _openrlhf_group(state, cfg, engine, servers, seeds, max_len=2048):
    """The group's episodes as OpenRLHF's RolloutRayActor.generate_responses runs them: concurrently,
    each through ``AgentExecutor.execute``; sample j's engine draws with seeds[j]."""
    executor = agent.AgentExecutor()
    prompt = agent.stage1_prompt(engine.tokenizer, state.history, cfg)
    label = _label(state, cfg, servers)
    return await asyncio.gather(*(executor.execute(prompt, label, _openrlhf_params(cfg), max_len, engine.tokenizer,
                                                   VLLMShaped(engine, s)) for s in seeds))


def _local_group(state, cfg, engine, servers):
    async def go():
        return await episode.run_group(state, engine, RetrieverClient(servers["retriever"]),
                                       RewardClient(servers["reward"]), cfg, 0)
    return asyncio.run(go())


def _mask(out):
    mask = [0] * len(out["observation_tokens"])
    for start, end in out["action_ranges"]:
        mask[start:end] = [1] * (end - start)
    return mask


def _state():
    return load_states("valid")[3]
