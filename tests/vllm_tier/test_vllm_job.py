"""The GRPO job (ray_jobs/train_grpo.py) with ``rollout.engine: vllm`` on this CPU, end to end: its own
local Ray, the retriever and reward servers it starts (a 40-chunk ESConv-train index, the ``vowels``
rule), a rollout worker whose vLLM engine (vLLM's CPU build, float32, tiny model of head size 32)
runs the two-stage episode, the learner, and the weights pushed to the engine after every update.

After each push the next step's rollouts come from the new weights: the learner's log-probs of the
sampled tokens before its update equal the engine's recorded ones (``logp_diff``, mean absolute gap per
trained token) within ``BOUND`` = 1e-4 at every step, while the policy moves away from its start by far
more than that (its KL to the reference, and the gap the engine's start would show); a checkpoint after
every step, and ``--resume`` continues from the last one with the engine loaded with its weights (the
resumed step's gap is under the bound too). Sampling keeps the whole vocabulary (top-k 0, top-p 1): vLLM's
recorded log-probs are then the learner's log-softmax(z / T).
Run: .venv-vllm/bin/python -m pytest -q tests/vllm_tier/test_vllm_job.py   (~3 min)"""

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

vllm = pytest.importorskip("vllm")

from trainer.metrics import read_metrics  # noqa: E402

pytestmark = pytest.mark.vllm
ROOT = Path(__file__).resolve().parents[2]
BOUND = 1e-4


def _job(out: Path, index: Path, steps: int, ray_tmp: str) -> list[str]:
    items = [f"run.output_dir={out}", f"ray.tmpdir={ray_tmp}", "policy.model=tiny-random:qwen2-hd32", "rollout.engine=vllm",
             "rollout.dtype=float32", "rollout.vllm_kv_cache_gb=0.25", "rollout.vllm_enforce_eager=true",
             "rollout.max_seq_len=1024", "rollout.top_k=0", "rollout.top_p=1.0", "rollout.temperature=1.0",
             "rollout.max_new_tokens_stage1=8", "rollout.max_new_tokens_stage2=8", "rollout.group_size=2",
             f"retriever.index_dir={index}", "reward.rule=vowels", "data.max_history_turns=1",
             "data.max_train_states=6", "grpo.batch_states=2", f"grpo.steps={steps}", "grpo.checkpoint_every=1",
             "grpo.lr=3.0e-2", "grpo.tensorboard=false", "safety.rollout_metric=false", "rollout.torch_threads=1",
             "ray.num_cpus=4"]
    return [sys.executable, "-m", "ray_jobs.train_grpo", "--config", "configs/cpu-test.yaml",
            *[a for item in items for a in ("-o", item)]]


@pytest.fixture
def ray_tmp():
    """A short folder for the job's own Ray: its socket paths must stay under 108 bytes."""
    path = tempfile.mkdtemp(prefix="rv-", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_grpo_job_pushes_weights_to_vllm_after_every_update_and_resumes(tmp_path, esconv_index, ray_tmp):
    out = tmp_path / "run"
    first = subprocess.run(_job(out, esconv_index, 3, ray_tmp), cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3] and [r["version"] for r in rows] == [1, 2, 3]
    assert all(r["logp_diff"] < BOUND for r in rows), [r["logp_diff"] for r in rows]
    assert rows[-1]["kl"] > 100 * BOUND, rows[-1]  # the weights moved: a stale engine would be far off
    assert (out / "checkpoints" / "latest").read_text().strip() == "step-000003"
    resumed = subprocess.run(_job(out, esconv_index, 4, ray_tmp) + ["--resume"], cwd=ROOT, capture_output=True, text=True,
                             timeout=600)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "resumed from step 3" in resumed.stdout
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and rows[-1]["logp_diff"] < BOUND, rows[-1]
    assert (out / "policy" / "model.safetensors").is_file()
