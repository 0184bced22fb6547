"""The OpenRLHF agent (trainer/openrlhf/agent.py) through OpenRLHF 0.11.2's real
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
import types
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import serving

pytest.importorskip("openrlhf.utils.agent", reason="make install adds the no-deps OpenRLHF these tests use")

from escrag.config import ConfigError, RolloutConfig, load_config  # noqa: E402
from escrag.data import load_states  # noqa: E402
from escrag.seeds import derive_seed  # noqa: E402
from retriever_server.client import RetrieverClient  # noqa: E402
from reward_server.client import RewardClient  # noqa: E402
from rollout import episode  # noqa: E402
from rollout.engines.base import SamplingParams  # noqa: E402
from rollout.engines.hf_engine import HFEngine  # noqa: E402
from trainer.openrlhf import agent  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RULE = "length:8"
OVERRIDES = ["rollout.group_size=3", "rollout.temperature=1.0", "rollout.top_k=0", "rollout.max_new_tokens_stage1=12",
             "rollout.max_new_tokens_stage2=12", "retriever.k=2"]


@pytest.fixture(scope="module")
def servers(tmp_path_factory, esconv_index):
    """A retriever over a 40-chunk ESConv-train index and the rule reward server (real processes)."""
    tmp = tmp_path_factory.mktemp("openrlhf-agent-servers")
    with serving(tmp, esconv_index, RULE) as urls:
        yield urls


@pytest.fixture(scope="module")
def engine(tiny_model):
    return HFEngine(tiny_model, RolloutConfig(compile=False), seed=0)  # compiling has its own tests


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
    stop_reason: str | None  # vLLM: the stop string that ended it, None for EOS or length


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
        params = SamplingParams(sp.max_tokens, sp.temperature, sp.top_p, max(sp.top_k, 0), tuple(sp.stop))
        self.requests.append(sp)
        seed = self.seeds[len(self.requests) - 1]
        (gen,) = await asyncio.to_thread(self.engine.generate, [list(prompt_token_ids)], params, [seed])
        lps = [{t: _Logprob(lp)} for t, lp in zip(gen.token_ids, gen.logprobs)] if sp.logprobs else None
        stop = sp.stop[0] if gen.finish_reason == "stop" and not gen.ended_with_eos else None
        return types.SimpleNamespace(outputs=[_Completion(list(gen.token_ids), gen.text, gen.finish_reason, lps, stop)])


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


def _seeds(n, group_seed=0):
    """Sample j of a local group draws stage s with derive_seed(group seed, j, s) (rollout/episode.py)."""
    return [[derive_seed(group_seed, j, 1), derive_seed(group_seed, j, 2)] for j in range(n)]


def _compare(outs, group, train_stage1=False):
    for out, s in zip(outs, group.samples, strict=True):
        seq = s.sequence
        assert out["observation_tokens"] == seq.input_ids
        assert _mask(out) == seq.loss_mask
        trained = seq.action_ranges if train_stage1 else seq.action_ranges[1:]
        assert [tuple(r) for r in out["action_ranges"]] == [tuple(r) for r in trained]
        assert out["rollout_log_probs"] == pytest.approx(seq.old_logprobs, abs=1e-5)  # batch of N vs one row
        assert out["reward"] == pytest.approx(s.reward) and out["scores"] == pytest.approx(s.reward)
        logs = out["extra_logs"]
        assert (logs["rm_score"], logs["format_reward"], logs["episode_complete"]) == pytest.approx(
            (s.rm_score, s.format_reward, 1.0))


def test_two_stage_episodes_equal_the_local_episode(engine, servers):
    """Default (paper) setting: only c is trained; ĉ, the feedback and the prompt are masked."""
    cfg, state = _cfg(), _state()
    group = _local_group(state, cfg, engine, servers)
    outs = asyncio.run(_openrlhf_group(state, cfg, engine, servers, _seeds(3)))
    _compare(outs, group)
    train = {st.state_id: st for st in load_states("train")}
    for out, s in zip(outs, group.samples):
        (c1, c2) = s.sequence.action_ranges
        assert out["action_ranges"] == [c2] and sum(_mask(out)) == c2[1] - c2[0] > 0
        assert len(s.exemplar_ids) == 2 and c2[0] > c1[1]  # the feedback sits between ĉ and c
        feedback = engine.tokenizer.decode(out["observation_tokens"][c1[1]:c2[0]])
        for i, eid in enumerate(s.exemplar_ids, 1):  # each exemplar shows its ESConv labels
            gold = train[eid]
            assert f"[Exemplar {i}] Strategy: {', '.join(gold.strategies)}. Problem: {gold.problem}." in feedback
    # the samples differ (their own seeds), so the group has something to normalise
    assert len({tuple(o["observation_tokens"]) for o in outs}) == 3


def test_train_stage1_trains_both_actions(engine, servers):
    cfg, state = _cfg("rollout.train_stage1=true"), load_states("valid")[5]
    group = _local_group(state, cfg, engine, servers)
    outs = asyncio.run(_openrlhf_group(state, cfg, engine, servers, _seeds(3)))
    _compare(outs, group, train_stage1=True)
    assert all(len(o["action_ranges"]) == 2 for o in outs)


def test_vanilla_grpo_scores_the_single_action(engine, servers):
    cfg, state = _cfg("rollout.rag=false"), _state()
    group = _local_group(state, cfg, engine, servers)
    outs = asyncio.run(_openrlhf_group(state, cfg, engine, servers, _seeds(3)))
    _compare(outs, group, train_stage1=True)
    assert all(len(o["action_ranges"]) == 1 for o in outs)


def test_stage_caps_and_stop_reach_every_request(engine, servers):
    """The executor offers the whole remaining context each turn; the agent caps each stage as the
    local engine does and adds top-k and the stop string."""
    cfg, state = _cfg("rollout.max_new_tokens_stage1=5", "rollout.max_new_tokens_stage2=7", "rollout.top_k=9"), _state()
    shaped = VLLMShaped(engine, _seeds(1)[0])
    prompt = agent.stage1_prompt(engine.tokenizer, state.history, cfg)
    out = asyncio.run(agent.AgentExecutor().execute(prompt, _label(state, cfg, servers), _openrlhf_params(cfg), 2048,
                                                    engine.tokenizer, shaped))
    assert [(r.max_tokens, r.top_k, r.stop) for r in shaped.requests] == [(5, 9, ["</response>"]), (7, 9, ["</response>"])]
    (start, end), = out["action_ranges"]
    assert end - start <= 7


def test_context_running_out_before_stage2_trains_nothing(engine, servers):
    cfg, state = _cfg(), _state()
    prompt = agent.stage1_prompt(engine.tokenizer, state.history, cfg)
    n_prompt = len(engine.tokenizer(prompt, add_special_tokens=False).input_ids)
    out = asyncio.run(agent.AgentExecutor().execute(prompt, _label(state, cfg, servers), _openrlhf_params(cfg),
                                                    n_prompt + 12, engine.tokenizer, VLLMShaped(engine, _seeds(1)[0])))
    assert out["action_ranges"] == [] and out["reward"] == 0
    assert out["extra_logs"]["episode_complete"] == 0.0


def test_label_round_trips_through_openrlhfs_prompt_dataset(engine, servers, tmp_path):
    """The dataset rows as OpenRLHF's own PromptDataset reads them (loaded by file: the package's
    datasets/__init__ needs HF datasets): our stage-1 prompt text and the agent's label."""
    from trainer.openrlhf import launch as orl

    cfg = _cfg(f"run.output_dir={tmp_path}")
    states = load_states("valid")[:4]
    [(path, count)] = orl.write_prompts(cfg, states, engine.tokenizer, servers["retriever"], servers["reward"])
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert count == len(rows)
    spec = importlib.util.spec_from_file_location(
        "openrlhf_prompts_dataset",
        Path(importlib.util.find_spec("openrlhf").submodule_search_locations[0]) / "datasets" / "prompts_dataset.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    a = orl.check_argv(orl.build_argv(load_config(ROOT / "configs" / "gpu-smoke.yaml")))
    args = types.SimpleNamespace(data=types.SimpleNamespace(input_key=a["data.input_key"], label_key=a["data.label_key"],
                                                            apply_chat_template=False, image_key="images"))
    strategy = types.SimpleNamespace(args=args, is_rank_0=lambda: True)
    ds = mod.PromptDataset(rows, engine.tokenizer, strategy)
    expected = orl.dataset_states(cfg, states)  # grpo.steps 2 x 2 states, in the local sampler's order
    assert len(ds) == len(expected) == 4
    for i, state in enumerate(expected):
        _, prompt, label, _ = ds[i]
        ids = engine.tokenizer(prompt, add_special_tokens=False).input_ids
        assert ids == episode.prompt_ids(engine.tokenizer, episode.stage1_messages(state.history, cfg))
        lab = json.loads(label)
        assert (lab["state_id"], lab["dialogue_id"], lab["history"]) == (state.state_id, state.dialogue_id,
                                                                       state.history)
        assert lab["reward_url"] == servers["reward"] and lab["config"]["retriever"]["k"] == 2
    with pytest.raises(ConfigError, match="openrlhf.max_len"):
        orl.write_prompts(_cfg(f"run.output_dir={tmp_path}", "openrlhf.max_len=64"), states, engine.tokenizer,
                          servers["retriever"], servers["reward"])


def _openrlhf_loader():
    """OpenRLHF 0.11.2's own ``_load_agent_executor``, read from its source and run here: the module it
    lives in imports vLLM at the top (the vLLM tier, tests/vllm_tier/, imports it whole)."""
    import ast
    import textwrap

    from openrlhf.utils.agent import AgentExecutorBase

    path = Path(importlib.util.find_spec("openrlhf").submodule_search_locations[0]) / "trainer" / "ray" / "vllm_engine.py"
    text = path.read_text()
    node = next(n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name == "_load_agent_executor")
    namespace = {"AgentExecutorBase": AgentExecutorBase}
    exec(compile(textwrap.dedent(ast.get_source_segment(text, node)), str(path), "exec"), namespace)
    return namespace["_load_agent_executor"]


def test_openrlhfs_loader_loads_the_agent_file():
    """Issue 52, finding 1: OpenRLHF runs the agent file as a module it never puts in ``sys.modules``; a
    module-level dataclass with postponed annotations then died in every vLLM engine actor's start."""
    from trainer.openrlhf import launch as orl

    executor = _openrlhf_loader()(orl.agent_path())
    assert type(executor).__name__ == "AgentExecutor" and executor.agent_instance_cls.__name__ == "TwoStageAgent"


def test_the_agents_clients_take_the_runs_timeouts(tmp_path):
    """The label carries the reward client's settings; the agent's clients are built with the run's
    retriever and reward timeouts, not the clients' defaults."""
    cfg = _cfg("retriever.timeout_s=7.5", "reward.timeout_s=3.25", "reward.wait_s=11")
    state = load_states("valid")[3]
    ep = agent._Episode.from_label(agent.episode_label(state, cfg, "http://127.0.0.1:9", "http://127.0.0.1:8"), None)
    retriever, reward = agent._retriever("http://127.0.0.1:9", ep.config_json), agent._reward("http://127.0.0.1:8",
                                                                                               ep.config_json)
    assert (ep.cfg.retriever.timeout_s, ep.cfg.reward.timeout_s, ep.cfg.reward.wait_s) == (7.5, 3.25, 11.0)
    assert retriever._http.timeout == 7.5 and reward._http.timeout == 3.25 and reward._http.policy.deadline_s == 11.0
