"""The streaming learner (trainer/learner.py ``LearnerActor``, ``place``; ray_jobs/train_grpo.py
``Lookahead``/``fit``) on the tiny random Qwen2 with real Ray actors on the session head:

- placement: on a CPU-only cluster the learner and the engines ask Ray for no GPU and run on the CPU;
  with GPUs the automatic shares go to the learner and the engines (whole GPUs when there are enough,
  fractions that pack onto the GPUs otherwise, what explicit shares leave), and the GPU request is in
  the learner actor's Ray options; a real learner actor on this CPU machine holds only its CPU;
- the staleness bound: groups sampled by an engine from the learner's own exported weights at known
  versions are fed to a learner actor with ``max_staleness`` 1; the group two versions behind is
  dropped and counted, and the weights after that step equal those of a second actor given only the
  fresh groups (so it was never trained); a batch of only stale groups makes no update; with π_old
  recomputed the decoupled objective's weight shows in the metrics;
- ``max_staleness`` 0: the job's loop (learner actor, lookahead) draws the same samples and ends with
  the same weights as the plain alternation of generate, update, push with an in-process learner;
- ``max_staleness`` 1: the rollouts of step s+1 are generated while step s updates (their groups carry
  the version from before that update, exactly one behind the learner when trained), nothing is
  dropped, and the data positions are those of the sampler.
Resume at ``max_staleness`` 1 (a killed job) is in tests/test_train_job.py.
Run: .venv/bin/python -m pytest -q tests/test_streaming.py   (~100 s on 2 shared cores)"""

import math

import pytest
import torch

from escrag.config import ConfigError, load_config
from escrag.records import Sample, ScoredGroup
from rollout.engines.base import SamplingParams
from rollout.episode import record
from trainer.learner import learner_options, place, split_stale
from trainer.metrics import read_metrics

PROMPTS = [[1, 504, 2088, 314, 253, 1345], [1, 9519, 28, 940, 446, 2], [1, 77, 78, 79]]


def _cfg(*over):
    return load_config("configs/cpu-test.yaml", list(over))


# ----------------------------------------------------------------------------- placement


def _packs(shares: list[float], gpus: int) -> bool:
    """First-fit of fractional shares onto ``gpus`` GPUs of capacity 1 (whole shares take whole GPUs)."""
    free = [1.0] * gpus
    for s in sorted(shares, reverse=True):
        slot = next((i for i, f in enumerate(free) if f + 1e-9 >= s), None)
        if slot is None:
            return False
        free[slot] -= s
    return True


def test_cpu_cluster_places_everything_on_the_cpu():
    cfg = place(_cfg(), gpus=0)
    assert (cfg.grpo.learner_gpus, cfg.rollout.worker_gpus) == (0.0, 0.0)
    assert (cfg.policy.device, cfg.rollout.device) == ("cpu", "cpu")
    assert learner_options(cfg)["num_gpus"] == 0.0
    from rollout.engines.vllm_engine import cpu_build

    vllm = place(_cfg("rollout.engine=vllm"), gpus=0)  # a CUDA vLLM keeps asking for a GPU; the CPU build runs here
    assert vllm.rollout.worker_gpus == (0.0 if cpu_build() else 1.0) and vllm.grpo.learner_gpus == 0.0


@pytest.mark.parametrize("gpus,workers,learner,worker", [(1, 1, 0.5, 0.5), (2, 1, 1.0, 1.0), (1, 3, 0.25, 0.25),
                                                         (2, 3, 0.5, 0.5), (4, 3, 1.0, 1.0)])
def test_gpu_shares_for_learner_and_engines(gpus, workers, learner, worker):
    cfg = place(_cfg(f"rollout.num_workers={workers}"), gpus=gpus)
    assert (cfg.grpo.learner_gpus, cfg.rollout.worker_gpus) == (learner, worker)
    assert (cfg.policy.device, cfg.rollout.device) == ("cuda", "cuda")
    assert learner_options(cfg)["num_gpus"] == learner  # the request Ray sees
    assert _packs([learner] + [worker] * workers, gpus)


def test_automatic_shares_always_pack():
    for gpus in range(1, 5):
        for workers in range(1, 7):
            cfg = place(_cfg(f"rollout.num_workers={workers}"), gpus=gpus)
            assert _packs([cfg.grpo.learner_gpus] + [cfg.rollout.worker_gpus] * workers, gpus), (gpus, workers)


def test_explicit_shares_are_kept_and_auto_fills_the_rest():
    smoke = place(_cfg("rollout.engine=vllm", "rollout.worker_gpus=0.3"), gpus=1)  # configs/gpu-smoke.yaml
    assert smoke.rollout.worker_gpus == 0.3 and smoke.grpo.learner_gpus == 0.7 and smoke.policy.device == "cuda"
    cpu_learner = place(_cfg("policy.device=cpu"), gpus=1)  # the engine gets the whole GPU
    assert (cpu_learner.grpo.learner_gpus, cpu_learner.rollout.worker_gpus) == (0.0, 1.0)
    assert cpu_learner.policy.device == "cpu" and cpu_learner.rollout.device == "cuda"
    fixed = place(_cfg("grpo.learner_gpus=1", "rollout.worker_gpus=0", "rollout.device=cpu"), gpus=1)
    assert (fixed.grpo.learner_gpus, fixed.rollout.worker_gpus, fixed.rollout.device) == (1.0, 0.0, "cpu")
    assert learner_options(fixed) == {"num_cpus": 1.0, "num_gpus": 1.0, "max_restarts": 0}
    full = place(_cfg("rollout.worker_gpus=1"), gpus=1)  # the engine holds the only GPU: the learner gets none
    assert (full.grpo.learner_gpus, full.policy.device, full.rollout.device) == (0.0, "cpu", "cuda")


def test_decoupled_loss_needs_recomputed_old_logprobs():
    with pytest.raises(ConfigError, match="grpo.decoupled_loss"):
        learner_options(_cfg("grpo.decoupled_loss=true", "grpo.recompute_old_logprobs=false"))


# ----------------------------------------------------------------------------- staleness bound


def test_split_stale_boundary():
    groups = [ScoredGroup(f"s/{v}", [], v) for v in range(6)]
    for k in (0, 1, 2):
        fresh, stale = split_stale(groups, version=5, max_staleness=k)
        assert [g.policy_version for g in fresh] == list(range(5 - k, 6))
        assert [g.policy_version for g in stale] == list(range(0, 5 - k))


def _sample_groups(engine, rewards: list[list[float]]) -> list[ScoredGroup]:
    """Groups sampled for real by ``engine`` (its current weights and version), with given rewards."""
    groups = []
    for gi, row in enumerate(rewards):
        prompt = PROMPTS[gi % len(PROMPTS)]
        gens = engine.generate([prompt] * len(row), SamplingParams(8, 1.0, 1.0, 0, ()),
                               seeds=[100 * engine.version + 10 * gi + j for j in range(len(row))])
        samples = [Sample(record(prompt, g, None, None, True), output=g.text, reward=r) for g, r in zip(gens, row)]
        groups.append(ScoredGroup(f"v{engine.version}/{gi}", samples, engine.version))
    return groups


def _trainable(actor) -> dict:
    import ray

    return ray.get(actor.state_dict.remote())["trainable"]


def test_a_group_older_than_k_versions_is_never_trained(ray_session, tiny_model):
    import ray

    from rollout.engines.hf_engine import HFEngine
    from trainer.learner import start_learner

    cfg = place(_cfg(f"policy.model={tiny_model}", "grpo.max_staleness=1", "grpo.recompute_old_logprobs=true",
                     "grpo.learner_torch_threads=1", "grpo.kl_coef=0.0"), gpus=0)
    a, b = start_learner(cfg), start_learner(cfg)  # a gets the stale group too, b never sees it
    try:
        info = ray.get(a.describe.remote())
        assert info["device"] == "cpu" and "GPU" not in info["resources"]
        assert info["resources"]["CPU"] == cfg.grpo.learner_cpus and info["threads"] == 1
        engine = HFEngine(tiny_model, cfg.rollout, seed=0)
        rows = [[1.0, 0.0, 0.5, 0.0], [0.0, 2.0, 0.0, 1.0]]
        g0 = _sample_groups(engine, rows)  # sampled by version 0
        for actor in (a, b):
            m, version, ref = ray.get(actor.train.remote(g0))
            assert version == 1 and m["stale_groups"] == 0 and ref is not None
        engine.load_weights(ray.get(ref), 1)
        g1 = _sample_groups(engine, rows)  # sampled by the learner's version 1
        for actor in (a, b):
            m, version, ref = ray.get(actor.train.remote(g1))
            assert version == 2
        engine.load_weights(ray.get(ref), 2)
        g2 = _sample_groups(engine, rows[:1])
        stale, fresh = g0[:1], g1[:1] + g2  # learner at 2: v0 is two behind, v1 one, v2 none
        (ma, va, _), (mb, vb, _) = ray.get([a.train.remote(stale, fresh), b.train.remote(fresh)])
        assert ma["stale_groups"] == 1 and mb["stale_groups"] == 0 and ma["groups"] == 3
        assert ma["trained_sequences"] == mb["trained_sequences"] == 8
        assert ma["staleness_max"] == 1 and ma["staleness_mean"] == 0.5 and va == vb == 3
        wa, wb = _trainable(a), _trainable(b)
        assert wa.keys() == wb.keys() and all(torch.equal(wa[n], wb[n]) for n in wa)  # v0 left no trace
        # decoupled objective (π_old recomputed, k > 0): the lag-1 group's weight π_prox/π_behaviour != 1
        assert ma["iw_max"] > 1.0 + 1e-3 and ma["iw_mean"] != pytest.approx(1.0, abs=1e-4)
        assert ma["ratio_mean"] == pytest.approx(1.0, abs=1e-5)  # the ratio is against π_prox
        m, version, ref = ray.get(a.train.remote(g0 + g1))  # learner at 3: all of them too old
        assert m["stale_groups"] == 4 and m["optimizer_steps"] == 0 and version == 3 and ref is None
        assert all(torch.equal(t, wa[n]) for n, t in _trainable(a).items())
    finally:
        ray.kill(a)
        ray.kill(b)


# ----------------------------------------------------------------------------- the job's loop


def _job_cfg(out, reward_url: str, k: int, steps: int = 3):
    # batch-invariant rollouts: a row's log-probs then do not depend on which rows share its passes and
    # steps, which moves with when the episodes reach the engine; without it the two loops differed by
    # ~1e-6 in float32 in 4 of 5 runs once every waiting row entered at once (b662383)
    return place(load_config("configs/cpu-test.yaml", [
        f"run.output_dir={out}", f"reward.url={reward_url}", "rollout.rag=false", "rollout.max_new_tokens_stage1=8",
        "rollout.torch_threads=1", "rollout.batch_invariant=true", "data.max_history_turns=1", "data.max_train_states=6", "grpo.batch_states=2",
        f"grpo.steps={steps}", f"grpo.max_staleness={k}", "grpo.learner_torch_threads=1", "grpo.tensorboard=false",
        "grpo.checkpoint_every=1000"]), gpus=0)


def _fit(cfg, reward_url):
    import ray

    from rollout.pool import RolloutPool
    from trainer.learner import start_learner
    from trainer.loop import fit, train_states

    learner, pool = start_learner(cfg), RolloutPool(cfg, None, reward_url)
    try:
        summary = fit(cfg, pool, learner, train_states(cfg), log=lambda *_: None)
        return read_metrics(summary["metrics"]), read_metrics(f"{cfg.run.output_dir}/samples.jsonl"), _trainable(learner)
    finally:
        pool.shutdown()
        ray.kill(learner)


def _plain_alternation(cfg, reward_url):
    """The synchronous loop the job ran before the learner became an actor: generate, update in this
    process, push; one thread, as the actor has."""
    from escrag.seeds import derive_seed
    from rollout.pool import RolloutPool
    from trainer.learner import Learner
    from trainer.loop import train_states
    from trainer.sampler import StateSampler, total_steps

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    pool = RolloutPool(cfg, None, reward_url)
    try:
        learner, states = Learner(cfg), train_states(cfg)
        sampler, drawn = StateSampler(len(states), cfg.grpo.batch_states, cfg.run.seed), []
        for step in range(total_steps(cfg.grpo, len(states))):
            batch = [states[i] for i in sampler.next_batch()]
            groups = pool.generate(batch, [derive_seed(cfg.run.seed, "grpo", step, s.state_id) for s in batch])
            drawn += [(step + 1, g.state_id, g.policy_version, [s.output for s in g.samples], g.rewards) for g in groups]
            if learner.step(groups)["optimizer_steps"]:
                pool.push_weights(learner.export_weights(), learner.version)
        return drawn, learner.state_dict()["trainable"]
    finally:
        pool.shutdown()
        torch.set_num_threads(threads)


def test_k0_equals_the_plain_alternation(ray_session, vowels_server, tmp_path):
    cfg = _job_cfg(tmp_path / "k0", vowels_server, k=0)
    rows, samples, weights = _fit(cfg, vowels_server)
    want_samples, want_weights = _plain_alternation(cfg, vowels_server)
    got = [(r["step"], r["state_id"], r["version"], r["outputs"], r["rewards"]) for r in samples]
    assert got == want_samples
    assert [r["version"] for r in samples] == [0, 0, 1, 1, 2, 2]  # every group from the latest weights
    assert weights.keys() == want_weights.keys() and all(torch.equal(weights[n], want_weights[n]) for n in weights)
    assert all(r["stale_groups"] == 0 and r["staleness_max"] == 0 for r in rows)


def test_k1_generates_the_next_step_during_the_update(ray_session, vowels_server, tmp_path):
    from trainer.sampler import StateSampler

    cfg = _job_cfg(tmp_path / "k1", vowels_server, k=1, steps=4)
    rows, samples, _ = _fit(cfg, vowels_server)
    # step 2's rollouts were submitted before step 1's update and ran on version 0, and so on: each
    # step trains groups one version behind the learner (the first step has nothing older)
    assert [r["version"] for r in samples] == [0, 0, 0, 0, 1, 1, 2, 2]
    assert [r["staleness_max"] for r in rows] == [0, 1, 1, 1] and [r["version"] for r in rows] == [1, 2, 3, 4]
    assert all(r["stale_groups"] == 0 and r["trained_sequences"] + 4 * r["zero_adv_groups"] == 8 for r in rows)
    fresh = StateSampler(6, 2, seed=0)
    for r in rows:
        fresh.next_batch()
        assert (r["epoch"], r["data_index"]) == (fresh.epoch, fresh.index)
    assert all(math.isfinite(r["step_s"]) and r["samples_per_s"] > 0 for r in rows)
