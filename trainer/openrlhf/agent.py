"""The two-stage RAG episode as OpenRLHF's multi-turn agent, loaded by file through
``--train.agent_func_path`` (trainer/openrlhf/launch.py emits this file's path).

Owns: ``TwoStageAgent`` (an ``AgentInstanceBase``), ``AgentExecutor`` (the ``MultiTurnAgentExecutor``
subclass OpenRLHF's loader looks for), the prompt dataset's label (``episode_label``) and stage-1 text
(``stage1_prompt``). Prompts, parsing, the retrieval query, the feedback text and the reward parts come
from ``rollout.episode`` and the service clients: this module only maps them onto OpenRLHF's turns.

One episode, token for token the local backend's (rollout/episode.py, docs/cluster.md):
  observation  the stage-1 prompt (the dataset row, rendered by ``stage1_prompt``)
  action 1     ĉ, capped at ``rollout.max_new_tokens_stage1``, ending after ``</response>`` or EOS
  step 1       retrieval query of ĉ -> retriever (the state's own dialogue excluded) -> the feedback
               text (closes ĉ's turn unless it ended with EOS, the exemplars and the stage-2
               instruction as a system turn, the generation prompt) as environment feedback, which
               OpenRLHF tokenizes and masks; reward 0, not done
  action 2     c, capped at ``rollout.max_new_tokens_stage2``
  step 2       reward service on (H, c) -> r (reward and score), done
With ``rollout.rag: false`` step 1 scores ĉ and ends the episode (vanilla GRPO).

The executor trains every action range; ``AgentExecutor.execute`` drops the first one unless
``rollout.train_stage1`` (OpenRLHF's loss mask comes only from ``action_ranges``). Two things the
executor does not give, and how we get them:
- Per-stage sampling. OpenRLHF's sampling params hold temperature and top-p, and each turn the
  executor sets ``max_tokens`` to the context left. ``execute`` hands it a ``_StageEngine`` that puts
  the stage's ``SamplingParams.from_config`` token cap, top-k and stop string (kept in the text) and
  special-token-free text (as the local engines decode it) on each request.
- Whether ĉ ended with EOS (the feedback then does not close its turn again). ``step`` sees only the
  action text, which leaves EOS out; the stage engine notes it per action from vLLM's output (finish
  reason "stop" without a stop reason, as ``rollout/engines/vllm_engine.py`` reads it) and the agent reads it
  through a context variable set per episode (each episode runs in its own asyncio task, so episodes
  never see each other's).

The label carries the state (id, dialogue id, full history) and the run's settings (service URLs and
the config sections the episode reads), so the agent needs no file or environment of the launcher's.
The services' bearer token, when they use one, comes from ``ESCRAG_API_KEY`` in the Ray job's
runtime environment (as everywhere in the project); it is never written to the dataset.

No ``from __future__ import annotations`` here: OpenRLHF's loader (``_load_agent_executor``) executes this
file as a module that is not in ``sys.modules``, and ``@dataclass`` with string annotations looks the
class's module up there (``dataclasses._is_type``: ``'NoneType' object has no attribute '__dict__'``).
"""

import contextvars
import functools
import json
from dataclasses import dataclass, field

import torch
from openrlhf.utils.agent import AgentInstanceBase, MultiTurnAgentExecutor

from escrag import prompts
from escrag.config import Config, from_dict, to_dict
from retriever_server.client import RetrieverClient
from reward_server.client import RewardClient
from rollout import episode
from rollout.engines.base import SamplingParams

_LABEL_SECTIONS = ("data", "retriever", "rollout")  # the config sections the episode functions read
_CLIENT_KEYS = ("timeout_s", "wait_s", "backoff_s")  # of the reward section: its client's, the run's own


# ------------------------------------------------------------------------------ dataset side


def stage1_prompt(tokenizer, history: list[dict], cfg: Config) -> str:
    """The text of the stage-1 prompt; the executor tokenizes it without special tokens, which gives
    ``rollout.episode.prompt_ids`` of the same messages."""
    return prompts.render(tokenizer, episode.stage1_messages(history, cfg))


def episode_label(state, cfg: Config, retriever_url: str | None, reward_url: str) -> str:
    """The dataset row's label: the state and what the agent needs of the run, as one JSON string."""
    sections = to_dict(cfg)
    return json.dumps({"state_id": state.state_id, "dialogue_id": state.dialogue_id,
                       "history": state.history, "retriever_url": retriever_url, "reward_url": reward_url,
                       "config": {**{s: sections[s] for s in _LABEL_SECTIONS},
                                  "reward": {k: sections["reward"][k] for k in _CLIENT_KEYS}}})


@functools.lru_cache(maxsize=16)
def _config(config_json: str) -> Config:
    return from_dict(json.loads(config_json))


@functools.lru_cache(maxsize=16)
def _retriever(url: str, config_json: str) -> RetrieverClient:  # one client per URL and run
    return RetrieverClient(url, _config(config_json).retriever)  # the run's timeouts; bearer token: $ESCRAG_API_KEY


@functools.lru_cache(maxsize=16)
def _reward(url: str, config_json: str) -> RewardClient:
    return RewardClient(url, _config(config_json).reward)


# ------------------------------------------------------------------------------ one episode


@dataclass
class _Episode:
    """What the agent of one episode reads: the label, the run's config, the tokenizer and, per
    action, whether it ended with EOS (filled by the stage engine)."""

    label: dict
    cfg: Config
    tokenizer: object
    config_json: str  # the label's config sections, the key of the cached config and clients
    ended_with_eos: list[bool] = field(default_factory=list)

    @classmethod
    def from_label(cls, label: str, tokenizer) -> "_Episode":
        data = json.loads(label)
        config_json = json.dumps(data["config"], sort_keys=True)
        return cls(data, _config(config_json), tokenizer, config_json)

    @property
    def stages(self) -> int:
        return 2 if self.cfg.rollout.rag else 1


_EPISODE: contextvars.ContextVar[_Episode] = contextvars.ContextVar("escrag_openrlhf_episode")


class _StageEngine:
    """The engine the executor calls for one episode: applies the stage's sampling settings to each
    request (see module doc) and records the action's token ids."""

    def __init__(self, engine, ep: _Episode):
        self.engine, self.ep = engine, ep

    async def generate(self, prompt_token_ids, sampling_params, multi_modal_data=None):
        stage = min(len(self.ep.ended_with_eos) + 1, self.ep.stages)
        ours = SamplingParams.from_config(self.ep.cfg.rollout, stage)
        sampling_params.max_tokens = min(sampling_params.max_tokens, ours.max_new_tokens)
        sampling_params.top_k = ours.top_k or -1  # vLLM: -1 is the whole vocabulary
        sampling_params.stop = list(ours.stop_strings)
        sampling_params.include_stop_str_in_output = True
        sampling_params.skip_special_tokens = True
        out = await self.engine.generate(prompt_token_ids, sampling_params, multi_modal_data=multi_modal_data)
        done = out.outputs[0]  # vLLM: finished by EOS when "stop" names no stop string or token
        self.ep.ended_with_eos.append(done.finish_reason == "stop" and getattr(done, "stop_reason", None) is None)
        return out


class TwoStageAgent(AgentInstanceBase):
    """Step 1: retrieve for ĉ and return the stage-2 opening as feedback; step 2: score c, done."""

    def __init__(self, *args, **kwargs):
        self.steps = 0

    async def step(self, states: dict, **kwargs) -> dict:
        ep = _EPISODE.get()
        self.steps += 1
        if self.steps == 1 and ep.cfg.rollout.rag:
            return await self._retrieve(ep, states["action_text"])
        return await self._score(ep, states["action_text"])

    async def _retrieve(self, ep: _Episode, stage1_output: str) -> dict:
        lab, cfg = ep.label, ep.cfg
        query = episode.retrieval_query(stage1_output, lab["history"])
        exemplars = (await episode.retrieve(_retriever(lab["retriever_url"], ep.config_json), [query], cfg.retriever.k,
                                            [lab["dialogue_id"]]))[0]
        feedback = episode.feedback_text(ep.tokenizer, episode.stage1_messages(lab["history"], cfg), exemplars,
                                         ep.ended_with_eos[0])
        return {"rewards": torch.tensor(0.0), "scores": 0.0, "environment_feedback": feedback, "done": False,
                "extra_logs": {}}

    async def _score(self, ep: _Episode, output: str) -> dict:
        lab = ep.label
        scores = await _reward(lab["reward_url"], ep.config_json).score([{"history": lab["history"], "output": output}])
        r = float(scores["rewards"][0])
        return {"rewards": torch.tensor(r), "scores": r, "environment_feedback": "", "done": True,
                "extra_logs": {"rm_score": float(scores["rm_scores"][0]),
                               "format_reward": float(scores["format_rewards"][0]), "episode_complete": 1.0}}


class AgentExecutor(MultiTurnAgentExecutor):
    """OpenRLHF's multi-turn executor over ``TwoStageAgent``, with the stage engine and the stage-1
    range dropped unless ``rollout.train_stage1``."""

    def __init__(self):
        super().__init__(TwoStageAgent)

    async def execute(self, prompt, label, sampling_params, max_length: int, hf_tokenizer, llm_engine, images=None):
        ep = _Episode.from_label(label, hf_tokenizer)
        token = _EPISODE.set(ep)
        try:
            out = await super().execute(prompt, label, sampling_params, max_length, hf_tokenizer,
                                        _StageEngine(llm_engine, ep), images)
        finally:
            _EPISODE.reset(token)
        if len(out["action_ranges"]) < ep.stages:  # the context ran out before the last stage
            out["extra_logs"] = {"rm_score": 0.0, "format_reward": 0.0, "episode_complete": 0.0}
        if ep.cfg.rollout.rag and not ep.cfg.rollout.train_stage1:
            out["action_ranges"] = out["action_ranges"][1:]
        return out
