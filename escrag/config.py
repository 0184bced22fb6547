"""Typed configuration: ``configs/*.yaml`` -> nested dataclasses, validated at load.

Owns: every tunable number of the project (the one source of truth; modules take these objects, not
loose defaults) and the strict loader: an unknown key, a wrong type or an out-of-range value raises
``ConfigError`` naming the key path (``grpo.clip_eps: must be <= 1, got 3.0``).

Defaults are Table 4 of the paper where it gives a value; ``configs/`` holds the presets.
Ranges live in field metadata (``ge``/``gt``/``le``/``choices``) and are checked by the loader.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from escrag.errors import UserError


class ConfigError(UserError):
    """A config file or override is invalid; the message starts with the key path."""


def _f(default, **meta):
    """A field with a default (copied if mutable) and validation metadata."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class RunConfig:
    name: str = "escrag"
    output_dir: str = "runs/escrag"  # checkpoints, logs, plots, built artefacts
    seed: int = _f(0, ge=0)
    server_timeout_s: float = _f(600.0, gt=0.0)  # wait for a started server's /health (model loads)
    supervise_s: float = _f(1.0, gt=0.0)  # how often a job checks the servers it started (restarts dead ones)
    demo_examples: int = _f(3, ge=1)  # held-out test states the demo answers with RAG inference
    demo_compare_states: int = _f(16, ge=0)  # fixed held-out test states the demo scores SFT vs GRPO on; 0: skip
    demo_compare_samples: int = _f(2, ge=1)  # answers per state and policy (same seeds for both)


@dataclass
class RayConfig:
    address: str | None = None  # None: start a local Ray on 127.0.0.1; "auto" or an address: join
    num_cpus: int | None = _f(None, ge=1)
    tmpdir: str | None = None  # RAY_TMPDIR; None: <output_dir>/ray


@dataclass
class DataConfig:
    train: str = "train"  # bundled split name or ESConv-format JSONL path
    eval: str = "valid"
    test: str = "test"
    max_history_turns: int | None = _f(None, ge=1)  # keep the last N turns in prompts; None: all
    max_train_states: int | None = _f(None, ge=1)  # subsample the train states (seeded); None: all


@dataclass
class LoraConfig:
    enabled: bool = False
    r: int = _f(16, ge=1)
    alpha: int = _f(32, ge=1)
    dropout: float = _f(0.0, ge=0.0, lt=1.0)
    target_modules: list[str] = _f(["q_proj", "k_proj", "v_proj", "o_proj"])


@dataclass
class PolicyConfig:
    model: str = "packaged:smollm2-135m-instruct"  # see escrag.models.resolve_model
    # compute dtype of the learner and SFT (autocast; weights stay float32) and the engines' weights
    dtype: str = _f("float32", choices=("float32", "bfloat16", "float16"))
    device: str = "auto"  # learner, its reference and SFT: auto = cuda when a GPU is visible, else cpu
    lora: LoraConfig = field(default_factory=LoraConfig)


@dataclass
class RetrieverConfig:
    embedder: str = "packaged:minilm"
    index_dir: str | None = None  # None: <output_dir>/index
    source: str = _f("esconv", choices=("esconv", "prefs"))
    pairs: str | None = None  # ESC-Preference JSONL when source == "prefs"
    index_type: str = _f("flat", choices=("flat", "hnsw", "ivf"))
    k: int = _f(3, ge=1, le=50)  # Table 4: 3 retrieved chunks
    url: str | None = None  # use a running retriever; None: the job starts one
    embed_batch_size: int = _f(64, ge=1)
    device: str = "auto"  # embedder: auto = cuda when a GPU is visible, else cpu
    max_wait_ms: float = _f(5.0, ge=0.0)  # micro-batching window of the server
    # corpus: a chunk is (last turns of the history, counselor response)
    chunk_turns: int = _f(2, ge=1)  # history turns kept in a chunk
    chunk_chars: int = _f(400, ge=16)  # history characters kept in a chunk (the end is kept)
    max_chunks: int | None = _f(None, ge=1)  # keep the first N chunks (a CPU-sized corpus); None: all
    min_response_chars: int = _f(16, ge=0)  # drop shorter responses ("Hello!") from the corpus
    # index: HNSW / IVF knobs (flat, the default, is exact and has none)
    hnsw_m: int = _f(32, ge=4)  # graph degree
    hnsw_ef_construction: int = _f(200, ge=8)
    hnsw_ef_search: int = _f(128, ge=1)
    ivf_nlist: int = _f(1024, ge=1)  # clusters; capped at count/39 so each has training points
    ivf_nprobe: int = _f(32, ge=1)  # clusters visited per query
    # FAISS uses BLAS for flat search only from this many queries on; the faiss-cpu default here is
    # 128000, so batch 64 on 100k x 384 runs a per-query loop ~3x slower than BLAS (design 5)
    blas_threshold: int = _f(20, ge=1)
    # server
    max_queue: int = _f(4096, ge=1)  # queries waiting; beyond it /retrieve answers 503 + Retry-After
    max_queries: int = _f(256, ge=1)  # queries per request
    max_query_chars: int = _f(8000, ge=1)  # per query; the embedder reads ~256 tokens anyway
    max_body_bytes: int = _f(8 << 20, ge=1024)  # larger requests get 413
    # client (rollout workers, counselor API): a call is retried with backoff on connection errors,
    # 429 and 5xx (honouring Retry-After) until wait_s has passed, then the job stops cleanly
    timeout_s: float = _f(60.0, gt=0.0)  # one attempt
    wait_s: float = _f(300.0, gt=0.0)  # all attempts of one call (a restarted server reloads its model)
    backoff_s: float = _f(0.5, gt=0.0)  # first retry delay; doubles up to 8x


@dataclass
class RewardConfig:
    backbone: str = "packaged:smollm2-135m-instruct"
    head_dir: str | None = None  # None: <output_dir>/rm
    pairs: str | None = None  # None: silver pairs bootstrapped from ESConv train
    url: str | None = None  # use a running reward server; None: the job starts one
    rule: str | None = None  # the job serves this rule (reward_server/rules.py) instead of the RM: tests
    center_coef: float = _f(0.01, ge=0.0)  # λ of eq. 3 (Table 4: reward centering coefficient)
    epochs: int = _f(5, ge=1)
    lr: float = _f(5e-5, gt=0.0)
    batch_size: int = _f(1, ge=1)  # pairs per micro-batch (Table 4: per-device batch 1)
    grad_accum: int = _f(16, ge=1)
    heldout_fraction: float = _f(0.1, gt=0.0, lt=1.0)
    max_length: int = _f(1024, ge=16)  # tokens; longer inputs lose history from the left
    max_pairs: int | None = _f(None, ge=2)  # seeded subsample of the pairs to train on; None: all
    dtype: str = _f("float32", choices=("float32", "bfloat16", "float16"))  # frozen backbone dtype
    device: str = "auto"  # frozen backbone: auto = cuda when a GPU is visible, else cpu
    feature_cache: str | None = None  # cached backbone features; None: $ESCRAG_CACHE/rm-features
    feature_batch_size: int = _f(8, ge=1)
    max_batch: int = _f(32, ge=1)  # server micro-batch size
    max_wait_ms: float = _f(5.0, ge=0.0)
    max_queue: int = _f(1024, ge=1)  # server returns 503 + Retry-After beyond this
    max_body_bytes: int = _f(8 << 20, ge=1024)  # larger requests get 413
    timeout_s: float = _f(120.0, gt=0.0)  # client: one attempt
    wait_s: float = _f(300.0, gt=0.0)  # client: all attempts of one call (see retriever.wait_s)
    backoff_s: float = _f(0.5, gt=0.0)  # client: first retry delay; doubles up to 8x


@dataclass
class RolloutConfig:
    engine: str = _f("transformers", choices=("transformers", "vllm"))
    num_workers: int = _f(1, ge=1)
    group_size: int = _f(4, ge=2)  # N (Table 4: 4)
    temperature: float = _f(0.9, ge=0.0)  # 0 means greedy
    top_p: float = _f(0.95, gt=0.0, le=1.0)
    top_k: int = _f(64, ge=0)  # 0: full vocabulary; top-p then runs inside the top k
    max_new_tokens_stage1: int = _f(96, ge=1)
    max_new_tokens_stage2: int = _f(128, ge=1)
    rag: bool = True  # False: vanilla one-stage GRPO rollouts (ablation)
    train_stage1: bool = False  # True: stage-1 tokens also get loss mask 1 with the same advantage
    device: str = _f("auto", choices=("auto", "cpu", "cuda"))  # transformers engine; auto: cuda if present
    max_batch: int = _f(64, ge=1)  # rows decoding at once (transformers: KV slots; vllm: merged calls)
    torch_threads: int = _f(0, ge=0)  # torch intra-op threads per worker; 0: torch's default
    worker_cpus: float = _f(1.0, gt=0.0)  # Ray CPUs reserved per rollout worker actor
    # Ray GPUs per worker; None: auto (a share of the cluster's GPUs when the engine runs on one, see
    # trainer.learner.place); the vllm engine needs > 0 (0 means 1)
    worker_gpus: float | None = _f(None, ge=0.0)
    max_reissues: int = _f(3, ge=0)  # times the pool re-issues the states of a worker that died
    restart_timeout_s: float = _f(300.0, gt=0.0)  # how long the pool waits for Ray to restart a worker
    restart_poll_s: float = _f(0.1, gt=0.0)  # first poll of a restarting worker; doubles up to 20x
    vllm_gpu_memory: float = _f(0.6, gt=0.0, le=1.0)  # vLLM gpu_memory_utilization per engine
    # The transformers engine (rollout/engines/hf_engine.py; docs/rollout.md "The transformers engine").
    # Engine weights: auto = bfloat16 on CUDA or a CPU with AMX/AVX512-BF16 (~5x the float32 matmul
    # rate there), else policy.dtype. When it differs from policy.dtype the learner recomputes π_old.
    dtype: str = _f("auto", choices=("auto", "float32", "bfloat16", "float16"))
    # torch.compile the decode step (batch size and length are dynamic: one graph per sampling
    # params; the first compile takes minutes on a CPU, later processes reuse inductor's disk cache)
    compile: bool = True
    max_seq_len: int = _f(2048, ge=16)  # prompt + completion tokens of one row (its KV-cache slot)
    prefix_cache_tokens: int = _f(16384, ge=0)  # K/V of finished rows kept for prompts extending them


@dataclass
class SafetyConfig:
    """The crisis check (escrag/safety/, docs/safety.md): rules, a sentence head, a conversation head."""
    embedder: str = "packaged:minilm"  # the head's embedder; the numbers below are set for all-MiniLM-L6-v2
    tuning: str = "tuning"  # cases the head is fitted on: "tuning" (data/safety/tuning.jsonl) or a path
    head: bool = True  # False: rules only (no embedder is loaded)
    head_high: float = _f(0.99, gt=0.0, le=1.0)  # head probability of high -> "high" on its own
    head_cue: float = _f(0.8, gt=0.0, le=1.0)  # ... -> "high" next to a rule cue of the same category
    head_elevated: float = _f(0.5, gt=0.0, le=1.0)  # head probability of high -> "elevated"
    head_min_words: int = _f(3, ge=1)  # shorter sentences ("ok bye") go through the rules only
    head_c: float = _f(4.0, gt=0.0)  # inverse L2 strength of the head's logistic regression
    head_rounds: int = _f(2, ge=0)  # multiple-instance rounds (re-picking each high case's sentence)
    max_client_turns: int | None = _f(None, ge=1)  # check the last N client turns; None: all of them
    cache_size: int = _f(4096, ge=0)  # sentences whose head output is kept (a growing chat re-sends its turns)
    locale: str = _f("international", choices=("international", "us", "uk", "ie", "ca", "au", "eu"))
    help_text: str | None = None  # where to get help, in your own words; replaces the locale's lines
    rollout_metric: bool = True  # GRPO steps report risk_high_frac / risk_elevated_frac over their rollouts
    # The conversation head (escrag/safety/heads.py): a softmax regression over a language model's hidden
    # states of the whole conversation; the numbers below were chosen on round 6's dev half
    # (results/safety-designs), never on data/safety/eval.jsonl.
    backbone: str | None = "packaged:smollm2-135m-instruct"  # None: no conversation head
    conv_tuning: list[str] = _f(["tuning", "tuning-round6", "tuning-round7"])  # fitted on these, less round 6's dev groups
    conv_layers: list[int] = _f([8, 16, 24])  # hidden states (of 30 in SmolLM2-135M) averaged over tokens
    conv_c: float = _f(1.0, gt=0.0)  # inverse L2 strength of its logistic regression
    conv_high: float = _f(0.93, gt=0.0, le=1.0)  # P(high) -> "high" on its own
    conv_confirm: float = _f(0.2, ge=0.0, le=1.0)  # rules / sentence head "high" needs at least this, else elevated
    conv_elevated: float = _f(0.5, gt=0.0, le=1.0)  # P(high) -> at least "elevated"
    conv_batch: int = _f(16, ge=1)  # conversations per backbone forward
    # the backbone's device: cpu (default: next to vLLM, whose memory share it would eat into), cuda[:N],
    # or auto (cuda when a GPU is visible); a backbone larger than SmolLM2 is a GPU's job
    conv_device: str = "cpu"


@dataclass
class EndpointConfig:
    """An OpenAI-compatible chat endpoint (``escrag/llm/endpoint.py``): a judge, a baseline, a simulator."""

    base_url: str = ""  # up to and including /v1, e.g. https://api.openai.com/v1
    model: str = ""  # the "model" field of each request
    api_key_env: str | None = None  # environment variable holding the key; None: no Authorization header
    max_concurrency: int = _f(8, ge=1)  # requests in flight
    requests_per_minute: float | None = _f(None, gt=0.0)  # request starts are spaced 60/rpm s; None: no limit
    price_input_per_m: float = _f(0.0, ge=0.0)  # USD per million prompt tokens (cost accounting)
    price_output_per_m: float = _f(0.0, ge=0.0)  # USD per million completion tokens
    timeout_s: float = _f(120.0, gt=0.0)  # total time of one attempt
    retries: int = _f(5, ge=0)  # further attempts after connection errors, timeouts, 429 and 5xx
    backoff_s: float = _f(1.0, ge=0.0)  # wait before the first retry; doubles each time (Retry-After wins)
    max_backoff_s: float = _f(60.0, gt=0.0)  # cap on any wait, Retry-After included


@dataclass
class CounselorConfig:
    """``escrag serve counselor``: request limits and the remote-endpoint client."""

    max_body_bytes: int = _f(1 << 20, ge=1024)  # larger requests get 413 at once
    max_history_chars: int = _f(100_000, ge=1)  # longer conversations get 400 before any generation
    # --endpoint: limits, retries and prices of the remote model (its URL, model and key come from flags)
    endpoint: EndpointConfig = field(default_factory=EndpointConfig)


@dataclass
class SftConfig:
    data: str | None = None  # demonstrations JSONL; None: bootstrapped from ESConv train
    num_examples: int = _f(500, ge=1)
    epochs: int = _f(1, ge=1)
    lr: float = _f(2e-4, gt=0.0)
    batch_size: int = _f(4, ge=1)
    grad_accum: int = _f(1, ge=1)
    max_length: int = _f(512, ge=16)
    max_steps: int | None = _f(None, ge=1)
    max_grad_norm: float = _f(1.0, gt=0.0)


@dataclass
class GrpoConfig:
    # local: the project's learner (one machine); openrlhf: OpenRLHF's Ray trainer (docs/cluster.md)
    backend: str = _f("local", choices=("local", "openrlhf"))
    steps: int | None = _f(None, ge=1)  # None: `epochs` passes over the train states
    epochs: int = _f(2, ge=1)  # Table 4
    batch_states: int = _f(128, ge=1)  # dialogue states per step (Table 4: 128)
    lr: float = _f(1e-6, ge=0.0)  # Table 4
    clip_eps: float = _f(0.2, gt=0.0, le=1.0)  # δ of eq. 11
    kl_coef: float = _f(0.05, ge=0.0)  # Table 4; k3 estimator
    adv_eps: float = _f(1e-6, gt=0.0)  # ε of eq. 9, inside the square root
    ratio_level: str = _f("token", choices=("token", "sequence"))  # paper eq. 10 is per sequence
    loss_agg: str = _f("token_mean", choices=("token_mean", "seq_mean"))
    micro_batch_size: int = _f(4, ge=1)
    updates_per_batch: int = _f(1, ge=1)  # optimizer passes over each rollout batch
    # π_old of eq. 10: the learner's own log-probs before its first pass (True) or the rollout's
    # recorded behaviour log-probs (False); None: True for the vllm engine, False for transformers
    recompute_old_logprobs: bool | None = None
    # Streaming learner (trainer.learner.LearnerActor, docs/training.md). 0: rollouts wait for each
    # update (on-policy, the paper's setting); k > 0: rollouts of the next k steps are generated while
    # the learner updates, and a group more than k weights versions behind the learner is dropped
    max_staleness: int = _f(0, ge=0)
    # decoupled objective (AReaL): with π_old recomputed, clip against it and weight each token by
    # exp(π_old - behaviour); None: on when π_old is recomputed and max_staleness > 0
    decoupled_loss: bool | None = None
    behaviour_weight_cap: float | None = _f(5.0, ge=1.0)  # truncate that weight here; None: no truncation
    learner_cpus: float = _f(1.0, gt=0.0)  # Ray CPUs reserved for the learner actor
    learner_gpus: float | None = _f(None, ge=0.0)  # Ray GPUs of the learner; None: auto (trainer.learner.place)
    learner_torch_threads: int = _f(0, ge=0)  # torch intra-op threads of the learner; 0: Ray's (= its CPUs)
    max_grad_norm: float = _f(1.0, gt=0.0)
    checkpoint_every: int = _f(10, ge=1)
    keep_checkpoints: int = _f(2, ge=1)  # newest checkpoint folders kept on disk
    log_every: int = _f(1, ge=1)
    tensorboard: bool = True  # also write the per-step metrics as TensorBoard scalars
    log_samples: bool = True  # <output_dir>/samples.jsonl: every sampled output with its reward and exemplars


@dataclass
class OpenRLHFConfig:
    """The OpenRLHF backend (``trainer/openrlhf_launch.py``): placement and DeepSpeed knobs only; the
    algorithm's numbers (advantages, KL, lr, batch, sampling) come from ``grpo`` and ``rollout``."""

    nodes: int = _f(1, ge=1)
    gpus_per_node: int = _f(1, ge=1)  # actor (and reference) GPUs per node (paper: 2 for 3B, 4 for 7B)
    vllm_engines: int | None = _f(None, ge=1)  # None: nodes x gpus_per_node / vllm_tensor_parallel
    vllm_tensor_parallel: int = _f(1, ge=1)
    colocate: bool = True  # vLLM, actor and reference share the GPUs, sleeping in turn (hybrid engine)
    max_len: int = _f(4096, ge=64)  # tokens of one episode: stage-1 prompt + ĉ + feedback + c
    zero_stage: int = _f(3, ge=0, le=3)
    gradient_checkpointing: bool = True
    adam_offload: bool = False
    attn_implementation: str = "flash_attention_2"  # "sdpa" where flash-attn is not installed
    rollout_micro_batch_size: int = _f(8, ge=1)  # sequences per forward when making experience
    prefix_caching: bool = True  # stage 2 re-reads the stage-1 prompt and ĉ: vLLM reuses their KV


@dataclass
class JudgeConfig:
    """The seven-metric LLM judge (``escrag/llm/judge.py``; paper 4.1 and Appendix A.2)."""

    endpoint: str | None = None  # a name in ``endpoints``; None: no judge (offline proxy only)
    template: str = "judge_v1"  # escrag/templates/<template>.txt; recorded with every score
    temperature: float = _f(0.0, ge=0.0, le=2.0)
    max_tokens: int = _f(200, ge=16)
    json_mode: bool = False  # send response_format={"type": "json_object"} (OpenAI, vLLM accept it)
    max_history_turns: int | None = _f(None, ge=1)  # turns of history the judge sees; None: all


@dataclass
class EvalSystemConfig:
    """One system under evaluation: a policy served by ``escrag serve counselor``, or an endpoint."""

    name: str = ""  # unique; names the system in files and tables
    label: str | None = None  # shown in tables and figures; None: the name
    policy: str | None = None  # model spec or folder (exactly one of policy / endpoint)
    endpoint: str | None = None  # a name in ``endpoints`` (a baseline such as GPT-4o, or a served model)
    rag: bool = False  # two-stage RAG inference with the project's retriever
    k: int | None = _f(None, ge=1, le=50)  # exemplars per query; None: retriever.k
    overrides: list[str] = _f([])  # ``key=value`` for this system only (its counselor gets them as -o)


@dataclass
class EvalRowConfig:
    label: str = ""
    system: str = ""


@dataclass
class ProxyConfig:
    """The offline proxy report (``evaluation/proxy.py``): not the paper's judge, never mixed with it."""

    enabled: bool = True
    rm_dir: str | None = None  # proxy reward model from ``escrag eval proxy-rm``; None: no RM score
    training_rm_dir: str | None = None  # the RM the policy was trained against; None: reward.head_dir
    copy_ngram: int = _f(8, ge=2)  # a response "copies" when it shares this many consecutive words
    train_dialogues: int | None = _f(None, ge=2)  # proxy-rm: train dialogues to use; None: all disjoint ones


@dataclass
class HumanConfig:
    """The blind pairwise human study (``evaluation/human.py``; paper 4.4 and Appendix E)."""

    system: str | None = None  # the system under study; None: the first system
    baselines: list[str] = _f([])  # compared with ``system``; empty: every other system
    contexts: int = _f(100, ge=1)  # dialogue states drawn from the run's states (paper: 100)


@dataclass
class EvalConfig:
    states: int | None = _f(None, ge=1)  # seeded sample of test states; None: all of them
    temperature: float | None = _f(None, ge=0.0, le=2.0)  # answers; None: rollout.temperature
    concurrency: int = _f(8, ge=1)  # requests in flight to a counselor server
    answer_timeout_s: float = _f(900.0, gt=0.0)  # one counselor answer, queueing included
    bootstrap: int = _f(1000, ge=10)  # resamples for the confidence intervals
    ci: float = _f(0.95, gt=0.0, lt=1.0)
    systems: list[EvalSystemConfig] = _f([])
    table2: list[EvalRowConfig] = _f([])  # Table 2 rows in order; deltas are against the first row
    k_sweep: list[str] = _f([])  # RAG systems of one policy with k = 2, 3, 4 (Figure 3)
    proxy: ProxyConfig = field(default_factory=ProxyConfig)
    human: HumanConfig = field(default_factory=HumanConfig)


@dataclass
class PrefsConfig:
    """ESC-Preference construction (``escrag prefs build``, ``escrag/preference/build.py``; paper 3.2, App. A).

    Roles name endpoints in ``endpoints``; the evaluator scores with the ``judge`` section's template,
    temperature, max_tokens and json_mode (intermediate selection and the seven-metric evaluation)."""

    candidates: list[str] = _f([])  # three-stage reasoners (paper: GPT-4o, Gemini-2.5-Pro, DeepSeek-V3)
    generator: str | None = None  # paired response generator (paper: GPT-4o)
    evaluator: str | None = None  # stage selection and seven-metric scores (paper: GPT-5-chat)
    client: str | None = None  # client simulator; needed when simulate_turns > 0
    templates: str = "prefs_v1"  # escrag/templates/<templates>/: the prompt set, recorded in every pair
    states: int | None = _f(20, ge=1)  # seeded sample of data.train states; None: all of them
    state_ids: list[str] = _f([])  # build exactly these "<dialogue_id>/<turn_index>" states instead
    min_history_turns: int = _f(3, ge=1)  # skip states with a shorter history (greetings)
    max_history_turns: int | None = _f(None, ge=1)  # turns of history in the prompts; None: all
    simulate_turns: int = _f(0, ge=0)  # client turns simulated after each state (0: ESConv history as is)
    concurrency: int = _f(8, ge=1)  # states in flight
    temperature: float = _f(0.7, ge=0.0, le=2.0)  # candidates, generator and client simulator
    reasoning_max_tokens: int = _f(300, ge=16)  # one counselor stage answer
    select_max_tokens: int = _f(100, ge=16)  # one stage-selection answer
    response_max_tokens: int = _f(200, ge=16)  # one counselor reply (paired responses, simulation)
    client_max_tokens: int = _f(60, ge=8)  # one simulated client turn
    client_max_words: int = _f(60, ge=1)  # a longer client turn counts as malformed
    json_mode: bool = False  # send response_format={"type": "json_object"} to the JSON-answering stages
    budget_usd: float | None = _f(None, gt=0.0)  # stop cleanly before the build's cost would pass it
    output_dir: str | None = None  # None: <run.output_dir>/esc_preference


@dataclass
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    data: DataConfig = field(default_factory=DataConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    retriever: RetrieverConfig = field(default_factory=RetrieverConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    safety: SafetyConfig = field(default_factory=SafetyConfig)
    counselor: CounselorConfig = field(default_factory=CounselorConfig)
    sft: SftConfig = field(default_factory=SftConfig)
    grpo: GrpoConfig = field(default_factory=GrpoConfig)
    openrlhf: OpenRLHFConfig = field(default_factory=OpenRLHFConfig)
    endpoints: dict[str, EndpointConfig] = _f({})  # named OpenAI-compatible endpoints
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    prefs: PrefsConfig = field(default_factory=PrefsConfig)


# --------------------------------------------------------------------------- loading


def _check_range(path: str, value, meta) -> None:
    checks = (("ge", lambda v, b: v >= b, ">="), ("gt", lambda v, b: v > b, ">"),
              ("le", lambda v, b: v <= b, "<="), ("lt", lambda v, b: v < b, "<"))
    for key, ok, sym in checks:
        if key in meta and value is not None and not ok(value, meta[key]):
            raise ConfigError(f"{path}: must be {sym} {meta[key]}, got {value!r}")
    if "choices" in meta and value not in meta["choices"]:
        raise ConfigError(f"{path}: must be one of {list(meta['choices'])}, got {value!r}")


def _coerce(path: str, tp, value):
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return _coerce(path, args[0], value)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: expected a mapping, got {type(value).__name__}")
        return _build(tp, value, path)
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: expected a mapping, got {type(value).__name__}")
        _, item = typing.get_args(tp)
        return {str(k): _coerce(f"{path}.{k}", item, v) for k, v in value.items()}
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{path}: expected a list, got {type(value).__name__}")
        (item,) = typing.get_args(tp)
        return [_coerce(f"{path}[{i}]", item, v) for i, v in enumerate(value)]
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is float and isinstance(value, str):  # YAML reads 1e-6 as a string
        try:
            return float(value)
        except ValueError:
            pass
    if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
        raise ConfigError(f"{path}: expected {tp.__name__}, got {type(value).__name__} {value!r}")
    return value


def _build(cls, data: dict, prefix: str = ""):
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        where = f"{prefix}." if prefix else ""
        raise ConfigError(f"{where}{unknown[0]}: unknown key (known: {', '.join(sorted(fields))})")
    kwargs = {}
    for name, value in data.items():
        path = f"{prefix}.{name}" if prefix else name
        kwargs[name] = _coerce(path, hints[name], value)
        _check_range(path, kwargs[name], fields[name].metadata)
    return cls(**kwargs)


def _set_path(tree: dict, dotted: str, value) -> None:
    *parents, leaf = dotted.split(".")
    for p in parents:
        tree = tree.setdefault(p, {})
        if not isinstance(tree, dict):
            raise ConfigError(f"{dotted}: {p} is not a section")
    tree[leaf] = value


def from_dict(data: dict, overrides: list[str] = ()) -> Config:
    """Build a Config from a mapping plus ``key.path=value`` overrides (values parsed as YAML)."""
    data = dict(data or {})
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"{item}: override must look like section.key=value")
        key, raw = item.split("=", 1)
        _set_path(data, key.strip(), yaml.safe_load(raw))
    return _build(Config, data)


def load_config(path: str | Path | None = None, overrides: list[str] = ()) -> Config:
    """Load a YAML preset (None: all defaults) and apply overrides; errors name file and key."""
    data: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"{path}: config file not found")
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: invalid YAML: {exc}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: top level must be a mapping")
    try:
        return from_dict(data, overrides)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}" if path else str(exc)) from None


def to_dict(cfg) -> dict:
    return dataclasses.asdict(cfg)


def output_path(cfg: Config, *parts: str) -> Path:
    """A path under ``run.output_dir``."""
    return Path(cfg.run.output_dir, *parts)


@dataclass(frozen=True)
class RunPaths:
    """Where every stage reads and writes by default: the one place these paths are spelt."""

    index: Path  # retriever.index_dir, else <output_dir>/index
    pairs: Path  # reward.pairs, else <output_dir>/prefs/silver_pairs.jsonl (bootstrapped)
    rm: Path  # reward.head_dir, else <output_dir>/rm
    sft: Path  # <output_dir>/sft: the cold-start policy
    grpo: Path  # <output_dir>/grpo: the GRPO run of the pipeline (metrics, checkpoints, policy/)
    manifest: Path  # <output_dir>/pipeline.json: finished stages and their config keys


def run_paths(cfg: Config) -> RunPaths:
    root = Path(cfg.run.output_dir)
    return RunPaths(index=Path(cfg.retriever.index_dir) if cfg.retriever.index_dir else root / "index",
                    pairs=Path(cfg.reward.pairs) if cfg.reward.pairs else root / "prefs" / "silver_pairs.jsonl",
                    rm=Path(cfg.reward.head_dir) if cfg.reward.head_dir else root / "rm",
                    sft=root / "sft", grpo=root / "grpo", manifest=root / "pipeline.json")
