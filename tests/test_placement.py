"""The placement plan (trainer/placement.py) and the model shapes it sizes (escrag/shapes.py):

- every known shape's parameter count is the one transformers builds for its config (on the meta
  device), the published sizes of the paper's models, and the packaged / tiny models' own config.json;
- the paper presets fit on 2 x 80 and 4 x 80 GiB with the reward backbone in bfloat16 on a GPU, in the
  issue's ``placement.json`` shape; the reward server and the embedder get GPUs of their own choosing
  and are pinned there (``CUDA_VISIBLE_DEVICES``, inside an outer one too);
- what does not fit fails before anything starts, naming the GPU, the consumers and the numbers: the
  float32 reward backbone of the old presets, a too-small card; vLLM's share is lowered to what the
  resident services leave and the launcher emits the lowered value;
- the estimates move the right way (checkpointing, ZeRO stages, micro-batch, dtype);
- the local backend: on a CPU-only cluster everything is on the CPU; on one GPU the learner and the
  engine sit where their Ray shares put them; ``--dry-run`` of a local config that does not fit exits 2
  with one line and leaves its ``placement.json``.
Run: .venv/bin/python -m pytest -q tests/test_placement.py   (~25 s)"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from escrag.config import ConfigError, load_config
from escrag.shapes import KNOWN, hf_config, shape_of
from trainer import placement as pl

ROOT = Path(__file__).resolve().parent.parent


def _cfg(preset, *overrides):
    return load_config(ROOT / "configs" / f"{preset}.yaml", list(overrides))


def test_shapes_count_what_transformers_builds():
    import torch
    from transformers import AutoModel, AutoModelForCausalLM

    for name, shape in KNOWN.items():
        with torch.device("meta"):
            config = hf_config(shape)
            model = (AutoModelForCausalLM.from_config(config) if shape.decoder
                     else AutoModel.from_config(config, add_pooling_layer=False))
        assert sum(p.numel() for p in model.parameters()) == shape.params, name
    published = {"Qwen/Qwen2.5-3B-Instruct": 3.09e9, "Qwen/Qwen2.5-7B": 7.61e9, "BAAI/bge-m3": 0.568e9,
                 "packaged:smollm2-135m-instruct": 0.1345e9}
    for name, size in published.items():
        assert KNOWN[name].params == pytest.approx(size, rel=0.005), name


def test_packaged_shapes_are_their_config_files(tiny_model):
    from escrag.models import resolve_model

    assert shape_of(tiny_model) == KNOWN["tiny-random:qwen2"]
    assert shape_of(resolve_model("packaged:smollm2-135m-instruct")).params == KNOWN[
        "packaged:smollm2-135m-instruct"].params
    assert shape_of(resolve_model("packaged:minilm")) == KNOWN["packaged:minilm"]
    with pytest.raises(Exception, match="cannot size this model"):
        shape_of("someone/unknown-model")


@pytest.mark.parametrize("preset,gpus", [("paper-3b", (2, 80.0)), ("paper-7b", (4, 80.0))])
def test_paper_presets_fit_with_the_reward_model_in_bfloat16_on_a_gpu(preset, gpus):
    cfg = _cfg(preset)
    assert cfg.reward.dtype == "bfloat16" and pl.parse_gpus(cfg.placement.gpus) == gpus
    plan = pl.make_plan(cfg, gpus).require()
    data = plan.to_json()
    assert data["fits"] and [g["index"] for g in data["gpus"]] == list(range(gpus[0]))
    assert all(g["memory_gb"] == 80 and g["usable_gb"] == 79.2 and g["peak_gb"] <= 79.2 for g in data["gpus"])
    assert 0 < data["host"]["need_gb"] <= data["host"]["memory_gb"] == 256
    claims = {c["who"]: (g["index"], c["gb"]) for g in data["gpus"] for c in g["claims"]}
    assert {f"{w}:{i}" for w in ("vllm", "actor", "ref") for i in range(gpus[0])} <= set(claims)
    assert claims["reward"][0] != claims["embedder"][0]  # each on the GPU with the most room
    assert 14 < claims["reward"][1] < 25 and claims["vllm:0"][1] == round(0.6 * 79.2, 1)
    assert pl.service_devices(plan) == {"reward": claims["reward"][0], "retriever": claims["embedder"][0]}
    assert json.loads(json.dumps(data)) == data


def test_what_does_not_fit_is_named_with_its_numbers(tmp_path):
    old = _cfg("paper-3b", "reward.dtype=float32", "reward.max_batch=32", "grpo.micro_batch_size=8",
               "openrlhf.rollout_micro_batch_size=8")  # the presets before this plan
    plan = pl.make_plan(old, (2, 80.0))
    assert not plan.to_json()["fits"]
    with pytest.raises(ConfigError) as err:
        plan.require()
    text = str(err.value)
    assert "GPU 0 (80 GiB) needs" in text and "actor:0" in text and "reward" in text and "train phase" in text
    small = pl.make_plan(_cfg("paper-7b"), (4, 40.0))
    assert any("GPU" in p for p in small.problems)
    assert pl.make_plan(_cfg("paper-7b"), (2, 80.0)).problems[0].startswith("placement.gpus: 2 GPUs")


def test_vllm_gets_what_the_services_leave_and_the_launcher_emits_it(parser):
    from trainer.openrlhf import launch as orl

    cfg = _cfg("paper-3b", "rollout.vllm_gpu_memory=0.7")  # more than GPU 0 leaves beside the reward model
    plan = pl.make_plan(cfg, (2, 80.0)).require()
    assert plan.vllm_gpu_memory < 0.7 and "lowered from 0.7" in " ".join(plan.notes)
    gpu0, cap = plan.gpus[0], 80 * 0.99  # placement.usable_fraction
    assert gpu0.need("rollout") <= cap and plan.vllm_gpu_memory == pytest.approx(
        int(100 * (cap - (gpu0.need("rollout") - plan.vllm_gpu_memory * cap)) / cap) / 100)
    args = orl.check_argv(orl.build_argv(cfg), parser)
    assert args["vllm.gpu_memory_utilization"] == plan.vllm_gpu_memory


@pytest.fixture(scope="module")
def parser():
    pytest.importorskip("openrlhf", reason="make install adds the no-deps OpenRLHF these tests read")
    from trainer.openrlhf import launch as orl

    return orl.parser_from_source()


def test_estimates_move_the_right_way():
    s = KNOWN["Qwen/Qwen2.5-3B-Instruct"]
    ckpt, full = (pl.train_acts_gb(s, 8 * 2048, c, 2, 2, 8 * 512) for c in (True, False))
    assert ckpt < full / 5
    assert pl.zero_state_gb(s, 0, 4, False) > pl.zero_state_gb(s, 1, 4, False) > pl.zero_state_gb(s, 2, 4, False)
    assert pl.zero_state_gb(s, 2, 4, False) > pl.zero_state_gb(s, 3, 4, False) > pl.zero_state_gb(s, 3, 4, True)
    assert pl.zero_state_gb(s, 0, 1, False) == pytest.approx(16 * s.params / pl.GIB)
    assert pl.zero_state_gb(s, 3, 4, False, grad_bytes=4) == pytest.approx(18 * s.params / 4 / pl.GIB)
    assert pl.weights_gb(s, "float32") == 2 * pl.weights_gb(s, "bfloat16")
    assert pl.kv_gb(s, 1000, 2) == pytest.approx(2 * 36 * 256 * 2 * 1000 / pl.GIB)


GIB, P7 = 2**30, KNOWN["Qwen/Qwen2.5-7B-Instruct"].params  # 7,615,616,512 parameters


def _gpu2(plan):
    """GPU 2 of the 7B plan: an actor rank, its reference shard and an engine, no service."""
    return plan.gpus[2]


def test_the_rollout_phase_of_a_colocated_7b_gpu_holds_the_actor_shards_and_the_reference():
    """Fails on the plan before issue 52, which charged a sleeping actor and reference 1 GiB each
    (rollout 0.6 x 80 + 1 + 1 = 50.0 GiB on GPU 2). --ds.enable_sleep keeps the actor's bf16 ZeRO-3
    shards (lp_params is not in offload_deepspeed_states' list) and the reference never sleeps: each
    is 2 bytes x P / 4 ranks + 1 GiB of context. vLLM takes 0.6 of the 79.2 usable GiB (0.99 x 80)."""
    plan = pl.make_plan(_cfg("paper-7b"), (4, 80.0)).require()
    shard = 2 * P7 / 4 / GIB  # 3.546 GiB
    assert _gpu2(plan).need("rollout") == pytest.approx(0.6 * 79.2 + 2 * (shard + 1.0))  # 56.61
    claims = {c.who: c for c in _gpu2(plan).claims}
    assert claims["actor:2"].phase == claims["ref:2"].phase == "always"
    assert "lp_params" in claims["actor:2"].what and "ReferenceModelActor" in claims["ref:2"].what


def test_the_train_phase_charges_zero3_at_18_bytes_its_buffers_and_the_step():
    """ZeRO-3 with fp32 accumulation: 2 (bf16 params) + 4 (fp32 grads) + 4 (master) + 8 (moments) =
    18 bytes per parameter per rank; DeepSpeed's defaults add 1e9 + 5e7 gathered bf16 parameters and a
    5e8-element bf16 gradient bucket; the step flattens one 1e9-element sub-group's gradient to fp32 (the
    rank's share, 1.9e9, is larger); then the larger of the micro-batch's activations and the experience
    forward, 1 GiB of context, the reference (shard + 1) and the sleeping engine (1 + 2 GiB of graphs)."""
    cfg = _cfg("paper-7b")
    plan = pl.make_plan(cfg, (4, 80.0)).require()
    s, o = KNOWN["Qwen/Qwen2.5-7B-Instruct"], cfg.openrlhf
    state = 18 * P7 / 4 / GIB  # 31.92
    buffers = (2 * (10**9 + 5 * 10**7) + 2 * 5 * 10**8) / GIB  # 2.89
    step = 4 * 10**9 / GIB  # 3.73
    acts = max(pl.train_acts_gb(s, 1 * 4096, True, 2, 2, 4096),
               pl.forward_gb(s, o.rollout_micro_batch_size * 4096, 2, logits=True))
    actor = state + buffers + step + acts + 1.0
    assert _gpu2(plan).need("train") == pytest.approx(actor + (2 * P7 / 4 / GIB + 1.0) + (1.0 + 2.0))
    # and GPU 0, with the reward model beside them, stays inside the card at micro-batch 1
    assert plan.gpus[0].need("train") <= 79.2 and plan.gpus[0].need("rollout") <= 79.2
    two = pl.make_plan(_cfg("paper-7b", "grpo.micro_batch_size=2", "openrlhf.rollout_micro_batch_size=4"), (4, 80.0))
    assert two.problems and "GPU 0 (80 GiB) needs" in two.problems[0] and "train phase" in two.problems[0]


def test_host_ram_is_its_own_line_and_checked():
    """One node of the 7B preset: each of 4 ranks pins what offload_deepspeed_states moves (fp32 grads,
    master and moments 16P/4, the 5e8-element bf16 bucket) and each of 4 engines its bf16 weights (2P)."""
    plan = pl.make_plan(_cfg("paper-7b"), (4, 80.0)).require()
    want = (4 * (16 * P7 / 4 + 2 * 5 * 10**8) + 4 * 2 * P7) / GIB  # 117.2 + 56.7 = 173.9
    data = plan.to_json()["host"]
    assert plan.host_gb == pytest.approx(want) and data["need_gb"] == round(want, 1)
    assert {c["who"] for c in data["claims"]} == {"actor asleep", "vllm asleep"}
    assert "host RAM (per node): 173.9 of 256 GiB" in plan.table()
    small = pl.make_plan(_cfg("paper-7b", "placement.host_memory_gb=128"), (4, 80.0))
    assert small.problems == [f"host RAM: a node needs {want:.1f} GiB, placement.host_memory_gb is 128: "
                              f"actor asleep {4 * (16 * P7 / 4 + 10**9) / GIB:.1f} + vllm asleep {8 * P7 / GIB:.1f}"]
    # adam_offload keeps master, moments and fp32 gradients (16P) on the host for the whole run instead
    off = pl.make_plan(_cfg("paper-7b", "openrlhf.adam_offload=true"), (4, 80.0))
    assert off.host[0].who == "actor offload" and off.host[0].gb == pytest.approx(16 * P7 / GIB)


def _actor_gb(*overrides) -> float:
    plan = pl.make_plan(_cfg("paper-3b", *overrides), (2, 80.0))
    return sum(c.gb for c in plan.gpus[1].claims if c.who.startswith("actor:1"))


def test_the_actor_claim_follows_its_settings():
    base = _actor_gb()
    assert _actor_gb("grpo.micro_batch_size=4") > base and _actor_gb("openrlhf.max_len=2048") < base
    assert _actor_gb("policy.gradient_checkpointing=false") > base + 10
    assert _actor_gb("openrlhf.zero_stage=2") > base and _actor_gb("openrlhf.adam_offload=true") < base


def test_services_are_pinned_inside_an_outer_cuda_visible_devices(monkeypatch):
    from ray_jobs.services import gpu_env

    assert gpu_env(None) == {} and gpu_env(1) == {"CUDA_VISIBLE_DEVICES": "1"}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    assert gpu_env(1) == {"CUDA_VISIBLE_DEVICES": "6"}


def test_local_backend_plans():
    cpu = pl.make_plan(_cfg("cpu-test"), (0, 0.0)).require()
    assert cpu.gpus == [] and {"learner", "worker:0", "reward"} <= set(cpu.cpu)
    smoke = pl.make_plan(_cfg("gpu-smoke", "grpo.backend=local"), (1, 80.0)).require()
    claims = {c.who: c for c in smoke.gpus[0].claims}
    assert {"learner", "worker:0", "embedder"} <= set(claims) and "Ray share 0.7" in claims["learner"].what
    assert claims["worker:0"].gb == 0.25 * 80 * 0.99 and smoke.vllm_gpu_memory == 0.25
    assert pl.job_gpus(_cfg("cpu-test"), ray_gpus=0.0) == (0, 0.0)
    with pytest.raises(ConfigError, match="placement.gpus: the OpenRLHF backend"):
        pl.job_gpus(_cfg("paper-3b", "placement.gpus=null"))


def test_dry_run_of_a_plan_that_does_not_fit_exits_2_and_keeps_the_plan(tmp_path):
    out = tmp_path / "run"
    res = subprocess.run([sys.executable, "-m", "ray_jobs.train_grpo", "--config", "configs/cpu-test.yaml",
                          "--dry-run", "--gpus", "1x0.05", "-o", f"run.output_dir={out}"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stderr
    assert "placement: the plan does not fit; GPU 0 (0.05 GiB) needs" in res.stderr and "learner" in res.stderr
    assert "Traceback" not in res.stderr
    plan = json.loads((out / "placement.json").read_text())
    assert not plan["fits"] and plan["gpus"][0]["claims"][0]["who"] == "learner"
