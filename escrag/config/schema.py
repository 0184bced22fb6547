"""The config schema: every section of ``configs/*.yaml`` as a nested pydantic dataclass.

Owns: every tunable number of the project (the one source of truth; modules take these objects or
values passed from them, not loose defaults that repeat them) and each key's help text
(``Field(description=...)``, printed by ``escrag config show``), with its range and choices. Loading and
the key-path messages are ``escrag.config.load``; the run-folder layout is ``escrag.config.paths``.

Defaults are Table 4 of the paper where it gives a value; ``configs/`` holds the presets. Pydantic does
the validation (``extra="forbid"``, ``Field`` ranges, ``Literal`` choices, and the scalar rules of
``Int``/``Float``/``Bool``/``Str`` below). The sections stay real dataclasses: ``dataclasses.replace``
validates the new values too. ``auto`` dtypes stay ``auto`` here and are resolved where they are
used (``compute_dtype``, ``escrag.models.resolve_auto_dtype``: a GPU, or a CPU with AMX / AVX512-BF16,
gets bfloat16; the placement plan and the OpenRLHF launcher, which plan for GPUs, take bfloat16).
"""

from __future__ import annotations

import copy
from typing import Annotated, Literal

from pydantic import BeforeValidator, ConfigDict, Field, Strict
from pydantic.dataclasses import dataclass

from escrag.errors import UserError
from escrag.models import resolve_auto_dtype


class ConfigError(UserError):
    """A config file or override is invalid; the message starts with the key path."""


def _yaml_float(value):
    """YAML 1.1 reads ``1e-6`` (no dot) as a string; such a string is the float it spells."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    return value


# Scalar rules: an int is a float (and becomes one), a bool is neither an int nor a float, and a bool
# or a str is only itself (``rag: 3`` and ``seed: "3"`` are errors, not coerced).
Int = Annotated[int, Strict()]
Float = Annotated[float, Strict(), BeforeValidator(_yaml_float)]
Bool = Annotated[bool, Strict()]
Str = Annotated[str, Strict()]
Key = Annotated[str, BeforeValidator(str)]  # a mapping's key: YAML reads ``3:`` as an int

section = dataclass(config=ConfigDict(extra="forbid"))


def option(default, doc: str, **constraints):
    """A field: its default (a fresh copy per instance when mutable), help text and range constraints."""
    if isinstance(default, (list, dict)):
        return Field(default_factory=lambda: copy.deepcopy(default), description=doc, **constraints)
    return Field(default, description=doc, **constraints)


def subsection(cls, doc: str):
    """A nested section: a fresh default instance per config."""
    return Field(default_factory=cls, description=doc)


@section
class RunConfig:
    name: Str = option("escrag", "the run's name (each preset names itself after its file)")
    output_dir: Str = option("runs/escrag", "checkpoints, logs, plots, built artefacts")
    seed: Int = option(0, "seed of the run: sampling of states, rollouts and splits derive from it", ge=0)
    server_timeout_s: Float = option(600.0, "wait for a started server's /health (model loads)", gt=0.0)
    supervise_s: Float = option(1.0, "how often a job checks the servers it started (restarts dead ones)", gt=0.0)
    demo_examples: Int = option(3, "held-out test states the demo answers with RAG inference", ge=1)
    demo_compare_states: Int = option(16, "fixed held-out test states the demo scores SFT vs GRPO on; 0: skip", ge=0)
    demo_compare_samples: Int = option(2, "answers per state and policy (same seeds for both)", ge=1)


@section
class RayConfig:
    address: Str | None = option(None, 'None: start a local Ray on 127.0.0.1; "auto" or an address: join')
    num_cpus: Int | None = option(None, "CPUs of the local Ray a job starts; None: Ray's count of this machine",
                              ge=1)
    tmpdir: Str | None = option(None, "RAY_TMPDIR; None: <output_dir>/ray (either, where too long for Ray's sockets: a short "
                               "folder under the system temp dir, escrag/raylocal.py)")


@section
class DataConfig:
    train: Str = option("train", "bundled split name or ESConv-format JSONL path")
    eval: Str = option("valid", "held-out split (bundled name or ESConv-format JSONL path)")
    test: Str = option("test", "test split (bundled name or ESConv-format JSONL path)")
    max_history_turns: Int | None = option(None, "keep the last N turns in prompts; None: all", ge=1)
    max_train_states: Int | None = option(None, "subsample the train states (seeded); None: all", ge=1)


@section
class LoraConfig:
    enabled: Bool = option(False, "train LoRA adapters instead of all weights (learner and SFT)")
    r: Int = option(16, "LoRA rank", ge=1)
    alpha: Int = option(32, "LoRA alpha (the adapters' update is scaled by alpha / r)", ge=1)
    dropout: Float = option(0.0, "dropout on the adapters' input", ge=0.0, lt=1.0)
    target_modules: list[Str] = option(["q_proj", "k_proj", "v_proj", "o_proj"], "modules that get adapters")


@section
class PolicyConfig:
    model: Str = option("packaged:smollm2-135m-instruct", "see escrag.models.resolve_model")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = option(
        "float32", "compute dtype of the learner and SFT (autocast; weights stay float32) and the engines' "
        "weights; auto = bfloat16 where it is fast (policy.device a GPU, or a CPU with AMX / AVX512-BF16), "
        "else float32, resolved where it is used (compute_dtype)")
    device: Str = option("auto", "learner, its reference and SFT: auto = cuda when a GPU is visible, else cpu")
    gradient_checkpointing: Bool = option(False, "recompute each decoder layer's activations in the backward pass "
                                      "(learner, SFT and the OpenRLHF actor): less memory, ~1/3 more compute")
    lora: LoraConfig = subsection(LoraConfig, "LoRA adapters of the learner and SFT")

    @property
    def compute_dtype(self) -> str:
        """``dtype`` with ``auto`` resolved for ``device`` on this machine, where it is used (a preset
        loaded on a driver without a GPU keeps ``auto`` for the process that has one)."""
        return resolve_auto_dtype(self.dtype, self.device)


@section
class RetrieverConfig:
    embedder: Str = option("packaged:minilm", "sentence embedder of the corpus and the queries (a model spec)")
    index_dir: Str | None = option(None, "None: <output_dir>/index")
    source: Literal["esconv", "prefs"] = option("esconv", "corpus: ESConv train dialogues (esconv) or the "
                                            "ESC-Preference pairs (prefs)")
    pairs: Str | None = option(None, 'ESC-Preference JSONL when source == "prefs"')
    index_type: Literal["flat", "hnsw", "ivf"] = option("flat", "FAISS index: flat (exact), hnsw or ivf")
    k: Int = option(3, "Table 4: 3 retrieved chunks", ge=1, le=50)
    url: Str | None = option(None, "use a running retriever; None: the job starts one")
    embed_batch_size: Int = option(64, "texts per embedder batch (index build; the server's micro-batch size)", ge=1)
    device: Str = option("auto", "embedder: auto = cuda when a GPU is visible, else cpu")
    max_wait_ms: Float = option(5.0, "micro-batching window of the server", ge=0.0)
    forward_batch: Int = option(8, "texts per embedder forward in the server: a micro-batch is sorted by length "
                                "and embedded this many at a time (less padding than one forward)", ge=1)
    # corpus: a chunk is (last turns of the history, counselor response)
    chunk_turns: Int = option(2, "history turns kept in a chunk", ge=1)
    chunk_chars: Int = option(400, "history characters kept in a chunk (the end is kept)", ge=16)
    max_chunks: Int | None = option(None, "keep the first N chunks (a CPU-sized corpus); None: all", ge=1)
    min_response_chars: Int = option(16, 'drop shorter responses ("Hello!") from the corpus', ge=0)
    # index: HNSW / IVF knobs (flat, the default, is exact and has none)
    hnsw_m: Int = option(32, "graph degree", ge=4)
    hnsw_ef_construction: Int = option(200, "HNSW candidate list while building (larger: better graph, slower build)",
                                   ge=8)
    hnsw_ef_search: Int = option(128, "HNSW candidate list per query (larger: better recall, slower search)", ge=1)
    ivf_nlist: Int = option(1024, "clusters; capped at count/39 so each has training points", ge=1)
    ivf_nprobe: Int = option(32, "clusters visited per query", ge=1)
    blas_threshold: Int = option(20, "FAISS uses BLAS for flat search only from this many queries on; the faiss-cpu "
                             "default here is 128000, so batch 64 on 100k x 384 runs a per-query loop ~3x slower "
                             "than BLAS (design 5)", ge=1)
    # server
    max_queue: Int = option(4096, "queries waiting; beyond it /retrieve answers 503 + Retry-After", ge=1)
    max_queries: Int = option(256, "queries per request", ge=1)
    max_query_chars: Int = option(8000, "per query; the embedder reads ~256 tokens anyway", ge=1)
    max_body_bytes: Int = option(8 << 20, "larger requests get 413", ge=1024)
    # client (rollout workers, counselor API): a call is retried with backoff on connection errors,
    # 429 and 5xx (honouring Retry-After) until wait_s has passed, then the job stops cleanly
    timeout_s: Float = option(60.0, "one attempt", gt=0.0)
    wait_s: Float = option(300.0, "all attempts of one call (a restarted server reloads its model)", gt=0.0)
    backoff_s: Float = option(0.5, "first retry delay; doubles up to 8x", gt=0.0)


@section
class RewardConfig:
    backbone: Str = option("packaged:smollm2-135m-instruct", "frozen backbone of the reward model (a model spec)")
    head_dir: Str | None = option(None, "None: <output_dir>/rm")
    pairs: Str | None = option(None, "None: silver pairs bootstrapped from ESConv train")
    url: Str | None = option(None, "use a running reward server; None: the job starts one")
    rule: Str | None = option(None, "the job serves this rule (reward_server/rules.py) instead of the RM: tests")
    center_coef: Float = option(0.01, "λ of eq. 3 (Table 4: reward centering coefficient)", ge=0.0)
    epochs: Int = option(5, "passes over the training pairs (Table 4)", ge=1)
    lr: Float = option(5e-5, "learning rate of the linear head (Table 4)", gt=0.0)
    batch_size: Int = option(1, "pairs per micro-batch (Table 4: per-device batch 1)", ge=1)
    grad_accum: Int = option(16, "micro-batches per optimizer step (Table 4)", ge=1)
    heldout_fraction: Float = option(0.1, "share of the pairs held out to report the head's accuracy", gt=0.0, lt=1.0)
    max_length: Int = option(1024, "tokens; longer inputs lose history from the left", ge=16)
    max_pairs: Int | None = option(None, "seeded subsample of the pairs to train on; None: all", ge=2)
    silver_negatives: list[Literal["other_dialogue", "same_problem", "same_dialogue", "generic", "lecturing",
                                   "truncated"]] = option(
        ["other_dialogue", "generic", "lecturing", "truncated"],
        "kinds of rejected reply of the bootstrapped silver pairs (escrag/pairs.py; a kind named twice is drawn "
        "twice as often)", min_length=1)
    silver_per_state: Int = option(1, "silver pairs per ESConv state, of distinct negative kinds: the gold "
                                   "turn's features are shared by them", ge=1)
    layer: Int | None = option(None, "backbone layer whose output (after the final norm) feeds the head; the "
                               "layers above it are not run; None: the last", ge=1)
    pooling: Literal["last_token", "reply_mean"] = option(
        "last_token", "the head reads the input's last token, or the mean over the reply's tokens")
    weight_decay: Float = option(0.0, "AdamW weight decay of the head (on its standardised weights)", ge=0.0)
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = option(
        "float32", "frozen backbone dtype (its features and the head fitted on them); auto = bfloat16 where it is "
        "fast (reward.device a GPU, or a CPU with AMX / AVX512-BF16), else float32, resolved when the config is "
        "loaded")
    device: Str = option("auto", "frozen backbone: auto = cuda when a GPU is visible, else cpu")
    feature_cache: Str | None = option(None, "cached backbone features; None: $ESCRAG_CACHE/rm-features")
    feature_batch_size: Int = option(8, "sequences per backbone forward when computing features", ge=1)
    max_batch: Int = option(32, "server micro-batch size", ge=1)
    max_wait_ms: Float = option(5.0, "micro-batching window of the server", ge=0.0)
    max_queue: Int = option(1024, "server returns 503 + Retry-After beyond this", ge=1)
    max_body_bytes: Int = option(8 << 20, "larger requests get 413", ge=1024)
    timeout_s: Float = option(120.0, "client: one attempt", gt=0.0)
    wait_s: Float = option(300.0, "client: all attempts of one call (see retriever.wait_s)", gt=0.0)
    backoff_s: Float = option(0.5, "client: first retry delay; doubles up to 8x", gt=0.0)

    @property
    def compute_dtype(self) -> str:
        """``dtype`` with ``auto`` resolved for ``device`` on this machine, where it is used (a preset
        loaded on a driver without a GPU keeps ``auto`` for the process that has one)."""
        return resolve_auto_dtype(self.dtype, self.device)


@section
class RolloutConfig:
    engine: Literal["transformers", "vllm"] = option("transformers", "generation engine of the rollout workers "
                                                 "(rollout/engines/): transformers or vllm")
    num_workers: Int = option(1, "rollout worker actors", ge=1)
    group_size: Int = option(4, "N (Table 4: 4)", ge=2)
    temperature: Float = option(0.9, "0 means greedy", ge=0.0)
    top_p: Float = option(0.95, "nucleus sampling: keep the smallest set of tokens with this probability (Table 4)",
                      gt=0.0, le=1.0)
    top_k: Int = option(64, "0: full vocabulary; top-p then runs inside the top k", ge=0)
    max_new_tokens_stage1: Int = option(96, "token cap of stage 1's answer ĉ (the retrieval query)", ge=1)
    max_new_tokens_stage2: Int = option(128, "token cap of stage 2's answer c (after the exemplars)", ge=1)
    rag: Bool = option(True, "False: vanilla one-stage GRPO rollouts (ablation)")
    train_stage1: Bool = option(False, "True: stage-1 tokens also get loss mask 1 with the same advantage")
    device: Literal["auto", "cpu", "cuda"] = option("auto", "transformers engine; auto: cuda if present")
    max_batch: Int = option(64, "rows decoding at once (transformers: KV slots; vllm: merged calls)", ge=1)
    torch_threads: Int = option(0, "torch intra-op threads per worker; 0: torch's default", ge=0)
    worker_cpus: Float = option(1.0, "Ray CPUs reserved per rollout worker actor", gt=0.0)
    worker_gpus: Float | None = option(None, "Ray GPUs per worker; None: auto (a share of the cluster's GPUs when "
                                   "the engine runs on one, see trainer.learner.place; the vllm engine asks for 1 unless vLLM's "
                                   "CPU build runs it on a cluster without GPUs)", ge=0.0)
    max_reissues: Int = option(3, "times the pool re-issues the states of a worker that died", ge=0)
    restart_timeout_s: Float = option(300.0, "how long the pool waits for Ray to restart a worker", gt=0.0)
    restart_poll_s: Float = option(0.1, "first poll of a restarting worker; doubles up to 20x", gt=0.0)
    vllm_gpu_memory: Float = option(0.6, "vLLM gpu_memory_utilization per engine (vLLM's CPU build reads it as "
                                    "a share of the machine's RAM: set vllm_kv_cache_gb there)", gt=0.0, le=1.0)
    vllm_kv_cache_gb: Float | None = option(None, "vLLM KV cache per engine in GiB (kv_cache_memory_bytes); None: "
                                            "what vllm_gpu_memory leaves", gt=0.0)
    vllm_enforce_eager: Bool = option(False, "vLLM without torch.compile / CUDA graphs (on a CPU a compile costs "
                                      "~45 s per engine start and decodes no faster)")
    # The transformers engine (rollout/engines/hf_engine.py; docs/rollout.md "The transformers engine").
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = option(
        "auto", "Engine weights: auto = bfloat16 on CUDA or a CPU with AMX/AVX512-BF16 (~5x the float32 matmul "
        "rate there), else policy.dtype. When it differs from policy.dtype the learner recomputes π_old.")
    compile: Bool = option(True, "torch.compile the decode step (batch size and length are dynamic: one graph per "
                       "sampling params; the first compile takes minutes on a CPU, later processes reuse "
                       "inductor's disk cache)")
    max_seq_len: Int = option(2048, "prompt + completion tokens of one row (its KV-cache slot)", ge=16)
    prefix_cache_tokens: Int = option(16384, "K/V of finished rows kept for prompts extending them", ge=0)
    batch_invariant: Bool = option(False, "transformers engine: a row's tokens and log-probs depend only on its "
                               "prompt, seed, sampling params and max_batch, not on the rows beside it: every "
                               "step runs max_batch rows, a prefill pass per row, no prefix reuse; bitwise in "
                               "bfloat16 (rollout/engines/hf_engine.py)")


@section
class GuardConfig:
    """A guard model in the crisis check's path (``escrag.safety.guard``): its level combines with the
    embedded detector's (the higher wins); a guard that fails leaves the embedded verdict in force."""

    chat_url: Str | None = option(None, "OpenAI-compatible chat endpoint up to /v1 (a guard such as Llama Guard "
                              "served by vLLM, or any chat model); None: no chat guard")
    chat_model: Str = option("", 'the "model" field of the chat guard\'s requests')
    chat_kind: Literal["llama_guard", "levels"] = option(
        "llama_guard", 'llama_guard: it answers "safe" / "unsafe\\nS11"; levels: any chat model, asked to '
        'answer "none" / "elevated" / "high" and a category')
    moderation_url: Str | None = option(None, "OpenAI-moderations-shaped endpoint up to /v1 (POST /v1/moderations); "
                                    "None: none")
    moderation_model: Str = option("omni-moderation-latest", 'the "model" field of the moderation requests')
    moderation_high: Float = option(0.5, "a self-harm or violence score -> high", gt=0.0, le=1.0)
    moderation_elevated: Float = option(0.2, "... -> elevated", gt=0.0, le=1.0)
    api_key_env: Str | None = option(None, "environment variable holding the guard's key; None: no Authorization")
    timeout_s: Float = option(10.0, "total time of one attempt", gt=0.0)
    retries: Int = option(1, "further attempts after connection errors, timeouts, 429 and 5xx", ge=0)
    max_concurrency: Int = option(8, "requests in flight per endpoint", ge=1)


@section
class SafetyConfig:
    """The crisis check (escrag/safety/, docs/safety.md): rules, a sentence head, a conversation head."""
    embedder: Str = option("packaged:minilm", "the head's embedder; the numbers below are set for all-MiniLM-L6-v2")
    tuning: Str = option("tuning", 'cases the head is fitted on: "tuning" (data/safety/tuning.jsonl) or a path')
    head: Bool = option(True, "False: rules only (no embedder is loaded)")
    head_high: Float = option(0.99, 'head probability of high -> "high" on its own', gt=0.0, le=1.0)
    head_cue: Float = option(0.8, '... -> "high" next to a rule cue of the same category', gt=0.0, le=1.0)
    head_elevated: Float = option(0.5, 'head probability of high -> "elevated"', gt=0.0, le=1.0)
    head_min_words: Int = option(3, 'shorter sentences ("ok bye") go through the rules only', ge=1)
    head_c: Float = option(4.0, "inverse L2 strength of the head's logistic regression", gt=0.0)
    head_rounds: Int = option(2, "multiple-instance rounds (re-picking each high case's sentence)", ge=0)
    max_client_turns: Int | None = option(None, "check the last N client turns; None: all of them", ge=1)
    cache_size: Int = option(4096, "sentences whose head output is kept (a growing chat re-sends its turns)", ge=0)
    locale: Literal["international", "us", "uk", "ie", "ca", "au", "eu"] = option(
        "international", "whose crisis, emergency, abuse and poison lines the safety reply lists")
    help_text: Str | None = option(None, "where to get help, in your own words; replaces the locale's lines")
    elevated_note: Bool = option(True, "at elevated risk one gentle sentence naming where help is (safety.locale) "
                             "follows the model's reply in the counselor, never replacing it")
    guard: GuardConfig = subsection(GuardConfig, "a guard model whose verdict combines with the embedded detector's")
    rollout_metric: Bool = option(True, "GRPO steps report risk_high_frac / risk_elevated_frac over their rollouts")
    rollout_metric_samples: Int = option(0, "rollouts of each group the metric reads (the first N; 0: all): "
                                         "the fractions are over the rollouts read", ge=0)
    # The conversation head (escrag/safety/heads.py): a softmax regression over a language model's hidden
    # states of the whole conversation; the numbers below were chosen on round 6's dev half
    # (experiments/safety_designs), never on data/safety/eval.jsonl.
    backbone: Str | None = option("packaged:smollm2-135m-instruct", "None: no conversation head")
    conv_tuning: list[Str] = option(["tuning", "tuning-round6", "tuning-round7"],
                                "fitted on these, less round 6's dev groups")
    conv_layers: list[Int] = option([8, 16, 24], "hidden states (of 30 in SmolLM2-135M) averaged over tokens")
    conv_c: Float = option(1.0, "inverse L2 strength of its logistic regression", gt=0.0)
    conv_high: Float = option(0.93, 'P(high) -> "high" on its own', gt=0.0, le=1.0)
    conv_confirm: Float = option(0.2, 'rules / sentence head "high" needs at least this, else elevated',
                             ge=0.0, le=1.0)
    conv_elevated: Float = option(0.5, 'P(high) -> at least "elevated"', gt=0.0, le=1.0)
    conv_veto_max_turn_chars: Int = option(1500, "the head may lower the rules' high only when no turn is longer than "
                                       "this (the tuning cases' longest turn has 1,305 characters): its average "
                                       "over a long turn dilutes a crisis beside it", ge=1)
    conv_batch: Int = option(16, "conversations per backbone forward (on a CPU only renders of similar length share one)", ge=1)
    conv_dtype: Literal["auto", "float32", "bfloat16"] = option(
        "auto", "the backbone's compute: auto = bfloat16 autocast where bfloat16 is fast (a GPU, a CPU with AMX "
        "or AVX512-BF16), else float32; each dtype has its own fitted head (both shipped for the default)")
    conv_device: Str = option("cpu", "the backbone's device: cpu (default: next to vLLM, whose memory share it would "
                          "eat into), cuda[:N], or auto (cuda when a GPU is visible); a backbone larger than "
                          "SmolLM2 is a GPU's job")


@section
class EndpointConfig:
    """An OpenAI-compatible chat endpoint (``escrag/llm/endpoint.py``): a judge, a baseline, a simulator."""

    base_url: Str = option("", "up to and including /v1, e.g. https://api.openai.com/v1")
    model: Str = option("", 'the "model" field of each request')
    api_key_env: Str | None = option(None, "environment variable holding the key; None: no Authorization header")
    max_concurrency: Int = option(8, "requests in flight", ge=1)
    requests_per_minute: Float | None = option(None, "request starts are spaced 60/rpm s; None: no limit", gt=0.0)
    price_input_per_m: Float = option(0.0, "USD per million prompt tokens (cost accounting)", ge=0.0)
    price_output_per_m: Float = option(0.0, "USD per million completion tokens", ge=0.0)
    timeout_s: Float = option(120.0, "total time of one attempt", gt=0.0)
    retries: Int = option(5, "further attempts after connection errors, timeouts, 429 and 5xx", ge=0)
    backoff_s: Float = option(1.0, "wait before the first retry; doubles each time (Retry-After wins)", ge=0.0)
    max_backoff_s: Float = option(60.0, "cap on any wait, Retry-After included", gt=0.0)


@section
class CounselorConfig:
    """``escrag serve counselor``: request limits and the remote-endpoint client."""

    max_body_bytes: Int = option(1 << 20, "larger requests get 413 at once", ge=1024)
    max_history_chars: Int = option(100_000, "longer conversations get 400 before any generation (their last "
                                "turns within it are checked for a crisis first)", ge=1)
    max_queue: Int = option(64, "requests answered at once; more get 503 with Retry-After", ge=1)
    retry_after_s: Int = option(2, "the Retry-After of a 503", ge=1)
    endpoint: EndpointConfig = subsection(EndpointConfig, "--endpoint: limits, retries and prices of the remote model "
                                    "(its URL, model and key come from flags)")


@section
class SftConfig:
    data: Str | None = option(None, "demonstrations JSONL; None: bootstrapped from ESConv train")
    num_examples: Int = option(500, "demonstrations used (the first N of data, or N bootstrapped)", ge=1)
    epochs: Int = option(1, "passes over the demonstrations", ge=1)
    lr: Float = option(2e-4, "learning rate", gt=0.0)
    batch_size: Int = option(4, "demonstrations per micro-batch", ge=1)
    grad_accum: Int = option(1, "micro-batches per optimizer step", ge=1)
    max_length: Int = option(512, "tokens of one demonstration (prompt + response)", ge=16)
    max_steps: Int | None = option(None, "stop after this many optimizer steps; None: `epochs` passes", ge=1)
    max_grad_norm: Float = option(1.0, "gradient norm clip", gt=0.0)


@section
class GrpoConfig:
    backend: Literal["local", "openrlhf"] = option("local", "local: the project's learner (one machine); openrlhf: "
                                               "OpenRLHF's Ray trainer (docs/cluster.md)")
    steps: Int | None = option(None, "None: `epochs` passes over the train states", ge=1)
    epochs: Int = option(2, "Table 4", ge=1)
    batch_states: Int = option(128, "dialogue states per step (Table 4: 128)", ge=1)
    lr: Float = option(1e-6, "Table 4", ge=0.0)
    clip_eps: Float = option(0.2, "δ of eq. 11", gt=0.0, le=1.0)
    kl_coef: Float = option(0.05, "Table 4; k3 estimator", ge=0.0)
    adv_eps: Float = option(1e-6, "ε of eq. 9, inside the square root", gt=0.0)
    ratio_level: Literal["token", "sequence"] = option("token", "paper eq. 10 is per sequence")
    loss_agg: Literal["token_mean", "seq_mean"] = option("token_mean", "token_mean: over all trained tokens of the "
                                                     "batch; seq_mean: per sequence, then over sequences (eq. 11)")
    micro_batch_size: Int = option(4, "sequences per learner forward and backward", ge=1)
    share_prompt: Bool = option(True, "learner: a micro-batch holds one group's samples and their common prompt "
                            "runs once (its KV cache reused by each sample, trainer.policy.prefix_tail_logprobs); "
                            "False: every sequence in full, micro-batches length-sorted over the batch. Off "
                            "under policy.gradient_checkpointing")
    updates_per_batch: Int = option(1, "optimizer passes over each rollout batch", ge=1)
    recompute_old_logprobs: Bool | None = option(None, "π_old of eq. 10: the learner's own log-probs before its "
                                             "first pass (True) or the rollout's recorded behaviour log-probs "
                                             "(False); None: True for the vllm engine, False for transformers")
    max_staleness: Int = option(0, "Streaming learner (trainer.learner.LearnerActor, docs/training.md). 0: rollouts "
                            "wait for each update (on-policy, the paper's setting); k > 0: rollouts of the next "
                            "k steps are generated while the learner updates, and a group more than k weights "
                            "versions behind the learner is dropped", ge=0)
    decoupled_loss: Bool | None = option(None, "decoupled objective (AReaL): with π_old recomputed, clip against it "
                                     "and weight each token by exp(π_old - behaviour); None: on when π_old is "
                                     "recomputed and max_staleness > 0")
    behaviour_weight_cap: Float | None = option(5.0, "truncate that weight here; None: no truncation", ge=1.0)
    learner_cpus: Float = option(1.0, "Ray CPUs reserved for the learner actor", gt=0.0)
    learner_gpus: Float | None = option(None, "Ray GPUs of the learner; None: auto (trainer.learner.place)", ge=0.0)
    learner_torch_threads: Int = option(0, "torch intra-op threads of the learner; 0: Ray's (= its CPUs)", ge=0)
    max_grad_norm: Float = option(1.0, "gradient norm clip", gt=0.0)
    checkpoint_every: Int = option(10, "steps between checkpoints", ge=1)
    keep_checkpoints: Int = option(2, "newest checkpoint folders kept on disk", ge=1)
    log_every: Int = option(1, "steps between progress lines", ge=1)
    tensorboard: Bool = option(True, "also write the per-step metrics as TensorBoard scalars")
    log_samples: Bool = option(True, "<output_dir>/samples.jsonl: every sampled output with its reward and exemplars")
    eval_every: Int = option(0, "steps between held-out validations (data.eval states through the two-stage rollout, "
                         "logged under eval/); 0: none", ge=0)
    eval_states: Int = option(32, "held-out states of each validation: a seeded sample of data.eval, the same at "
                          "every validation of a run", ge=1)


@section
class OpenRLHFConfig:
    """The OpenRLHF backend (``trainer/openrlhf/launch.py``): placement and DeepSpeed knobs only; the
    algorithm's numbers (advantages, KL, lr, batch, sampling) come from ``grpo`` and ``rollout``."""

    nodes: Int = option(1, "Ray nodes of the actor (and reference)", ge=1)
    gpus_per_node: Int = option(1, "actor (and reference) GPUs per node (paper: 2 for 3B, 4 for 7B)", ge=1)
    vllm_engines: Int | None = option(None, "None: nodes x gpus_per_node / vllm_tensor_parallel", ge=1)
    vllm_tensor_parallel: Int = option(1, "GPUs per vLLM engine (tensor parallel size)", ge=1)
    colocate: Bool = option(True, "vLLM, actor and reference share the GPUs, sleeping in turn (hybrid engine)")
    max_len: Int = option(4096, "tokens of one episode: stage-1 prompt + ĉ + feedback + c", ge=64)
    zero_stage: Int = option(3, "DeepSpeed ZeRO stage", ge=0, le=3)
    adam_offload: Bool = option(False, "keep the Adam states in CPU memory")
    attn_implementation: Str = option("flash_attention_2", '"sdpa" where flash-attn is not installed')
    rollout_micro_batch_size: Int = option(8, "sequences per forward when making experience", ge=1)
    prefix_caching: Bool = option(True, "stage 2 re-reads the stage-1 prompt and ĉ: vLLM reuses their KV")
    grad_accum_dtype: Literal["fp32", "bf16"] = option(
        "fp32", "dtype DeepSpeed accumulates the micro-batches' gradients in (--ds.grad_accum_dtype): fp32 like "
        "the local learner (ZeRO-3's gradient partition then takes 4 bytes a parameter per rank, not 2; "
        "trainer/placement.py counts it)")


@section
class PlacementConfig:
    """Where the GPU consumers sit and what they need (``trainer/placement.py``, docs/cluster.md)."""

    gpus: Str | None = option(None, '"<count>x<GiB>", e.g. "2x80": the GPUs the plan is made for (OpenRLHF: every node\'s, '
                          "the head's first; --dry-run plans for them anywhere); the local job counts Ray's GPUs "
                          "and takes their memory from here, else from torch", pattern=r"^[0-9]+x[0-9]+(\.[0-9]+)?$")
    process_overhead_gb: Float = option(1.0, "GiB a process holds on a GPU besides its tensors (CUDA context, "
                                    "allocator slack; a sleeping vLLM engine's context)", ge=0.0)
    usable_fraction: Float = option(0.99, "the share of each GPU's memory (placement.gpus, or torch's figure) a "
                                    "plan may fill: torch reports 79.1-79.3 GiB for an \"80 GB\" A100/H100, so "
                                    "2x80 plans for 79.2 GiB each (tests/gpu/device_check.py records gpu_total_gb)",
                                    gt=0.0, le=1.0)
    vllm_graphs_gb: Float = option(2.0, "GiB of CUDA graphs a colocated vLLM engine keeps while asleep (level-1 "
                                   "sleep frees only its weights and KV cache; OpenRLHF never sets enforce_eager): "
                                   "vLLM logs 'Estimated CUDA graph memory: 1.62 GiB' for a dense Qwen at its "
                                   "default capture sizes (vllm-project/vllm#39559); 0 with enforce_eager", ge=0.0)
    host_memory_gb: Float = option(256.0, "GiB of each node's RAM the run may pin (OpenRLHF: the optimizer states "
                                   "--ds.enable_sleep or adam_offload moves there, vLLM's level-1 sleep copy of "
                                   "its weights); a plan that needs more does not fit. Set it to the node's RAM "
                                   "less what else runs there", ge=0.0)


@section
class JudgeConfig:
    """The seven-metric LLM judge (``escrag/llm/judge.py``; paper 4.1 and Appendix A.2)."""

    endpoint: Str | None = option(None, "a name in ``endpoints``; None: no judge (offline proxy only)")
    template: Str = option("judge_v1", "escrag/templates/<template>.txt; recorded with every score")
    temperature: Float = option(0.0, "sampling temperature of the judge", ge=0.0, le=2.0)
    max_tokens: Int = option(200, "tokens of one judge answer", ge=16)
    json_mode: Bool = option(False, 'send response_format={"type": "json_object"} (OpenAI, vLLM accept it)')
    max_history_turns: Int | None = option(None, "turns of history the judge sees; None: all", ge=1)


@section
class EvalSystemConfig:
    """One system under evaluation: a policy served by ``escrag serve counselor``, or an endpoint."""

    name: Str = option("", "unique; names the system in files and tables")
    label: Str | None = option(None, "shown in tables and figures; None: the name")
    policy: Str | None = option(None, "model spec or folder (exactly one of policy / endpoint)")
    endpoint: Str | None = option(None, "a name in ``endpoints`` (a baseline such as GPT-4o, or a served model)")
    rag: Bool = option(False, "two-stage RAG inference with the project's retriever")
    k: Int | None = option(None, "exemplars per query; None: retriever.k", ge=1, le=50)
    overrides: list[Str] = option([], "``key=value`` for this system only (its counselor gets them as -o)")


@section
class EvalRowConfig:
    label: Str = option("", "the row's label in Table 2")
    system: Str = option("", "the system of the row (a name in eval.systems)")


@section
class ProxyConfig:
    """The offline proxy report (``evaluation/proxy.py``): not the paper's judge, never mixed with it."""

    enabled: Bool = option(True, "write the offline proxy report")
    rm_dir: Str | None = option(None, "proxy reward model from ``escrag eval proxy-rm``; None: no RM score")
    training_rm_dir: Str | None = option(None, "the RM the policy was trained against; None: reward.head_dir")
    copy_ngram: Int = option(8, 'a response "copies" when it shares this many consecutive words', ge=2)
    train_dialogues: Int | None = option(None, "proxy-rm: train dialogues to use; None: all disjoint ones", ge=2)


@section
class LabelsConfig:
    """Rewards checked against ESConv's human labels, and the independent MiniLM proxy
    (``evaluation/labels.py``, ``escrag eval labels``)."""

    states_per_dialogue: Int = option(3, "gold counselor turns scored per held-out dialogue (seeded)", ge=1)
    high: Int = option(5, "a seeker rating (empathy / relevance, 1-5) at or above this is high", ge=1, le=5)
    low: Int = option(3, "a seeker rating at or below this is low", ge=1, le=5)
    fit_states_per_dialogue: Int = option(2, "MiniLM proxy: gold turns per train dialogue it is fitted on", ge=1)
    proxy_c: Float = option(1.0, "MiniLM proxy: inverse L2 strength of its logistic regression", gt=0.0)
    proxy_fit_dialogues: Int | None = option(None, "MiniLM proxy: fit on a seeded sample of this many train dialogues "
                                             "(None: all); the demo's comparison fits its own", ge=2)


@section
class HumanConfig:
    """The blind pairwise human study (``evaluation/human.py``; paper 4.4 and Appendix E)."""

    system: Str | None = option(None, "the system under study; None: the first system")
    baselines: list[Str] = option([], "compared with ``system``; empty: every other system")
    contexts: Int = option(100, "dialogue states drawn from the run's states (paper: 100)", ge=1)


@section
class EvalConfig:
    states: Int | None = option(None, "seeded sample of test states; None: all of them", ge=1)
    temperature: Float | None = option(None, "answers; None: rollout.temperature", ge=0.0, le=2.0)
    concurrency: Int = option(8, "requests in flight to a counselor server", ge=1)
    answer_timeout_s: Float = option(900.0, "one counselor answer, queueing included", gt=0.0)
    bootstrap: Int = option(1000, "resamples for the confidence intervals", ge=10)
    ci: Float = option(0.95, "confidence level of the intervals", gt=0.0, lt=1.0)
    systems: list[EvalSystemConfig] = option([], "the systems under evaluation")
    table2: list[EvalRowConfig] = option([], "Table 2 rows in order; deltas are against the first row")
    k_sweep: list[Str] = option([], "RAG systems of one policy with k = 2, 3, 4 (Figure 3)")
    proxy: ProxyConfig = subsection(ProxyConfig, "the offline proxy report")
    labels: LabelsConfig = subsection(LabelsConfig, "rewards against ESConv's human labels; the MiniLM proxy")
    human: HumanConfig = subsection(HumanConfig, "the blind pairwise human study")


@section
class PrefsConfig:
    """ESC-Preference construction (``escrag prefs build``, ``escrag/preference/build.py``; paper 3.2, App. A).

    Roles name endpoints in ``endpoints``; the evaluator scores with the ``judge`` section's template,
    temperature, max_tokens and json_mode (intermediate selection and the seven-metric evaluation)."""

    candidates: list[Str] = option([], "three-stage reasoners (paper: GPT-4o, Gemini-2.5-Pro, DeepSeek-V3)")
    generator: Str | None = option(None, "paired response generator (paper: GPT-4o)")
    evaluator: Str | None = option(None, "stage selection and seven-metric scores (paper: GPT-5-chat)")
    client: Str | None = option(None, "client simulator; needed when simulate_turns > 0")
    templates: Str = option("prefs_v1", "escrag/templates/<templates>/: the prompt set, recorded in every pair")
    states: Int | None = option(20, "seeded sample of data.train states; None: all of them", ge=1)
    state_ids: list[Str] = option([], 'build exactly these "<dialogue_id>/<turn_index>" states instead')
    min_history_turns: Int = option(3, "skip states with a shorter history (greetings)", ge=1)
    max_history_turns: Int | None = option(None, "turns of history in the prompts; None: all", ge=1)
    simulate_turns: Int = option(0, "client turns simulated after each state (0: ESConv history as is)", ge=0)
    concurrency: Int = option(8, "states in flight", ge=1)
    temperature: Float = option(0.7, "candidates, generator and client simulator", ge=0.0, le=2.0)
    reasoning_max_tokens: Int = option(300, "one counselor stage answer", ge=16)
    select_max_tokens: Int = option(100, "one stage-selection answer", ge=16)
    response_max_tokens: Int = option(200, "one counselor reply (paired responses, simulation)", ge=16)
    client_max_tokens: Int = option(60, "one simulated client turn", ge=8)
    client_max_words: Int = option(60, "a longer client turn counts as malformed", ge=1)
    json_mode: Bool = option(False, 'send response_format={"type": "json_object"} to the JSON-answering stages')
    budget_usd: Float | None = option(None, "stop cleanly before the build's cost would pass it", gt=0.0)
    output_dir: Str | None = option(None, "None: <run.output_dir>/esc_preference")


@section
class Config:
    run: RunConfig = subsection(RunConfig, "its name, output folder, seed, server waits and the demo")
    ray: RayConfig = subsection(RayConfig, "the Ray cluster a job starts or joins")
    data: DataConfig = subsection(DataConfig, "ESConv splits and prompt history")
    policy: PolicyConfig = subsection(PolicyConfig, "the policy model trained by SFT and GRPO")
    retriever: RetrieverConfig = subsection(RetrieverConfig, "exemplar corpus, FAISS index, retriever server and client")
    reward: RewardConfig = subsection(RewardConfig, "reward model training, its server and client")
    rollout: RolloutConfig = subsection(RolloutConfig, "sampling, engines and Ray workers of the two-stage rollouts")
    safety: SafetyConfig = subsection(SafetyConfig, "the crisis check (docs/safety.md)")
    counselor: CounselorConfig = subsection(CounselorConfig, "escrag serve counselor")
    sft: SftConfig = subsection(SftConfig, "cold-start SFT (eq. 6)")
    grpo: GrpoConfig = subsection(GrpoConfig, "retrieval-augmented GRPO (eq. 9-11, Algorithm 1)")
    openrlhf: OpenRLHFConfig = subsection(OpenRLHFConfig, "the OpenRLHF backend (docs/cluster.md)")
    placement: PlacementConfig = subsection(PlacementConfig, "the GPUs a training job is planned for (docs/cluster.md)")
    endpoints: dict[Key, EndpointConfig] = option({}, "named OpenAI-compatible endpoints")
    judge: JudgeConfig = subsection(JudgeConfig, "the seven-metric LLM judge")
    eval: EvalConfig = subsection(EvalConfig, "the systems under evaluation, their tables, the proxy report and "
                            "the human study")
    prefs: PrefsConfig = subsection(PrefsConfig, "ESC-Preference construction (escrag prefs build)")


