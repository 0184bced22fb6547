"""Equal work per actor rank at every OpenRLHF step, checked by replaying OpenRLHF 0.11.2's own code.

The functions that decide who trains what are read from the installed package's source with ``ast`` and
run here (their modules import vLLM and CUDA-only parts at the top, so they are not imported):
``_collect_prompt_batch`` (a rollout batch from the prompt file, a short last one kept),
``RemoteExperienceMaker.split_rollout_samples`` (micro-experiences of ``--rollout.micro_batch_size``),
``RayActorGroup.async_run_method_batch`` (ceil(n / ranks) micro-experiences to each rank, in order),
the ``accumulated_gradient`` expression of ``DeepspeedStrategy.setup_distributed`` (DeepSpeed's
optimizer step every that many micro-steps), and the replay buffer's loader as ``ppo_train`` builds it
(a torch ``DataLoader`` of ``--train.micro_batch_size`` with ``drop_last``; its keywords are read from
the source too). Their inputs are the flags our launcher emits (parsed with the pinned parser) and the
prompt file's row count (``dataset_states`` on ESConv's 10,191 train states).

- both paper presets: every step of the run gives every rank the same forwards and the same number of
  micro-steps, equal to DeepSpeed's accumulation, and drops no sample; with the old prompt file (each
  state once: 10,191 rows, 79 in the last batch) the last step does not (finding 2 of issue 24);
- batch sizes given with ``-o``: a config loads exactly when the replay finds equal work at every step.
Run: .venv/bin/python -m pytest -q tests/test_rank_split.py   (~10 s)"""

import ast
import itertools
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from escrag.config import ConfigError, load_config

pytestmark = pytest.mark.unit

pytest.importorskip("openrlhf", reason="make install adds the no-deps OpenRLHF these tests read")
from trainer.openrlhf import launch as orl  # noqa: E402
from trainer.openrlhf.ranks import check_rank_split  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
ESCONV_TRAIN_STATES = 10_191


def _package() -> Path:
    return orl.openrlhf_source().parent.parent


def _node(relpath: str, *names: str):
    """The ``ast`` node at ``names`` (a class, then a method) in an OpenRLHF module."""
    node = ast.parse((_package() / relpath).read_text())
    for name in names:
        node = next(n for n in node.body if getattr(n, "name", None) == name)
    return node


def _function(relpath: str, *names: str, **globals_):
    """An OpenRLHF function or method, compiled from its source with ``globals_`` as its module."""
    node = _node(relpath, *names)
    source = textwrap.dedent(ast.get_source_segment((_package() / relpath).read_text(), node))
    namespace = dict(globals_)
    exec(compile(source, f"openrlhf/{relpath}", "exec"), namespace)  # noqa: S102 - the pinned package's own code
    return namespace[names[-1]]


class _Experience:
    @staticmethod
    def concat_experiences(samples, pad_token_id):
        return list(samples)


class _Rank:
    def __init__(self):
        self.chunks = []

    @property
    def execute_batch(self):
        return SimpleNamespace(remote=lambda method, chunk, start, end: self.chunks.append(chunk["experience"]))


@pytest.fixture(scope="module")
def openrlhf():
    """OpenRLHF's pieces, each run from its source."""
    loader = next(n for n in ast.walk(_node("trainer/ray/ppo_actor.py", "ActorPPOTrainer", "ppo_train"))
                  if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "DataLoader")
    kw = {k.arg: ast.unparse(k.value) for k in loader.keywords}
    assert (kw["batch_size"], kw["drop_last"]) == ("self.replay_buffer.sample_batch_size", "True")
    setup = _node("utils/deepspeed/deepspeed.py", "DeepspeedStrategy", "setup_distributed")
    gas = next(n.value for n in ast.walk(setup) if isinstance(n, ast.Assign)
               and ast.unparse(n.targets[0]) == "self.accumulated_gradient")
    return SimpleNamespace(
        collect=_function("trainer/ppo_utils/samples_generator.py", "_collect_prompt_batch"),
        split=_function("trainer/ppo_utils/experience_maker.py", "RemoteExperienceMaker", "split_rollout_samples",
                        Experience=_Experience),
        dispatch=_function("trainer/ray/launcher.py", "RayActorGroup", "async_run_method_batch",
                           ray=SimpleNamespace(put=lambda data: data)),
        gas=compile(ast.Expression(gas), "deepspeed.py", "eval"))


def _steps(openrlhf, args: dict, rows: int):
    """(per-rank forwards, per-rank micro-steps, per-rank samples dropped, DeepSpeed's accumulation)
    of every step of one pass over a prompt file of ``rows`` rows."""
    import torch.utils.data

    ranks, n = args["actor.num_nodes"] * args["actor.num_gpus_per_node"], args["rollout.n_samples_per_prompt"]
    strategy = SimpleNamespace(train_batch_size=args["train.batch_size"], ring_attn_size=1, ds_tensor_parallel_size=1,
                               micro_train_batch_size=args["train.micro_batch_size"], world_size=ranks)
    gas = eval(openrlhf.gas, {"self": strategy})  # noqa: S307 - OpenRLHF's expression
    maker = SimpleNamespace(args=SimpleNamespace(train=SimpleNamespace(dynamic_batch_enable=False),
                                                 rollout=SimpleNamespace(micro_batch_size=args["rollout.micro_batch_size"])),
                            tokenizer=SimpleNamespace(pad_token_id=0))
    loader = iter([(None, [i], [None], [None]) for i in range(rows)])  # the prompt loader: batch 1
    while True:
        prompts, _, _, exhausted = openrlhf.collect(loader, args["rollout.batch_size"])
        if prompts:
            samples = [SimpleNamespace(prompt=p) for p in prompts for _ in range(n)]
            group = SimpleNamespace(_actor_handlers=[_Rank() for _ in range(ranks)], duplicate_actors=1)
            openrlhf.dispatch(group, "append", experience=openrlhf.split(maker, samples))
            shares = [[s for micro in r.chunks[0] for s in micro] for r in group._actor_handlers]
            steps = [len(torch.utils.data.DataLoader(share, batch_size=strategy.micro_train_batch_size,
                                                     drop_last=True)) for share in shares]
            dropped = [len(s) - k * strategy.micro_train_batch_size for s, k in zip(shares, steps)]
            yield [len(r.chunks[0]) for r in group._actor_handlers], steps, dropped, gas
        if exhausted:
            return


def _equal_work(openrlhf, args: dict, rows: int) -> bool:
    """Every step: the same forwards and micro-steps on every rank, one optimizer step's worth, nothing dropped."""
    return all(len(set(f)) == 1 and set(k) == {gas} and not any(d) for f, k, d, gas in _steps(openrlhf, args, rows))


def _args(cfg) -> dict:
    """The flags the launcher emits for ``cfg``, as OpenRLHF's parser reads them."""
    return orl.check_argv(orl.build_argv(cfg), orl.parser_from_source())


def _resized(args: dict, cfg) -> dict:
    """``args`` with the batch numbers of ``cfg`` (as the launcher maps them), for sizes whose
    placement plan or rank split the launcher would refuse before emitting anything."""
    g = cfg.grpo
    return {**args, "rollout.batch_size": g.batch_states, "train.batch_size": g.batch_states * cfg.rollout.group_size,
            "train.micro_batch_size": g.micro_batch_size,
            "rollout.micro_batch_size": cfg.openrlhf.rollout_micro_batch_size}


@pytest.mark.parametrize("preset", ["paper-3b", "paper-7b"])
def test_paper_presets_give_every_rank_equal_work_at_every_step(openrlhf, preset):
    cfg = load_config(ROOT / "configs" / f"{preset}.yaml")
    args = _args(cfg)
    rows = len(orl.dataset_states(cfg, list(range(ESCONV_TRAIN_STATES))))
    assert rows % cfg.grpo.batch_states == 0 and rows >= cfg.grpo.epochs * ESCONV_TRAIN_STATES
    steps = list(_steps(openrlhf, args, rows))
    assert len(steps) == rows // cfg.grpo.batch_states == 160
    assert _equal_work(openrlhf, args, rows)
    # the prompt file before this rule: every state once, 79 in the last batch; at its paper micro-batch
    # of 8 the ranks got 160 and 156 samples there, 20 and 19 micro-steps
    forwards, micro, dropped, gas = list(_steps(openrlhf, args, ESCONV_TRAIN_STATES))[-1]
    assert not _equal_work(openrlhf, args, ESCONV_TRAIN_STATES) and set(micro) != {gas}
    old = _resized(args, load_config(ROOT / "configs" / f"{preset}.yaml", ["grpo.micro_batch_size=8",
                                                                             "openrlhf.rollout_micro_batch_size=8"]))
    if preset == "paper-3b":
        assert list(_steps(openrlhf, old, ESCONV_TRAIN_STATES))[-1][1] == [20, 19]


SIZES = {"grpo.batch_states": (128, 100, 96, 30), "grpo.micro_batch_size": (2, 3, 8),
         "openrlhf.rollout_micro_batch_size": (4, 6)}


@pytest.mark.parametrize("preset", ["paper-3b", "paper-7b"])
def test_a_config_passes_exactly_when_openrlhf_splits_it_evenly(openrlhf, preset):
    """Every combination of ``SIZES`` given with -o: the backend's check (``check_rank_split``, which the
    pipeline runs before its first stage and the launcher before it emits a command) passes iff the replay of a run over its
    prompt file (12 steps' worth here) finds equal work; a refused one names the key and the numbers."""
    loaded = refused = 0
    preset_args = _args(load_config(ROOT / "configs" / f"{preset}.yaml"))
    for values in itertools.product(*SIZES.values()):
        overrides = [f"{k}={v}" for k, v in zip(SIZES, values)] + ["grpo.steps=12"]
        try:
            check_rank_split(load_config(ROOT / "configs" / f"{preset}.yaml", overrides))
            ok = True
        except ConfigError as exc:
            ok = False
            assert "grpo.batch_states" in str(exc) and "actor ranks" in str(exc)
        cfg = load_config(ROOT / "configs" / f"{preset}.yaml", overrides)
        rows = len(orl.dataset_states(cfg, list(range(500))))
        assert _equal_work(openrlhf, _resized(preset_args, cfg), rows) == ok, overrides
        loaded, refused = loaded + ok, refused + (not ok)
    assert loaded and refused


def test_the_pipeline_refuses_an_uneven_split_before_its_first_stage(tmp_path):
    """The check runs before the index, RM and SFT stages (hours on a cluster), not at the GRPO stage."""
    from ray_jobs.pipeline import run_pipeline

    cfg = load_config(ROOT / "configs" / "paper-3b.yaml", ["grpo.batch_states=31", f"run.output_dir={tmp_path}"])
    with pytest.raises(ConfigError, match="actor ranks"):
        run_pipeline(cfg)
    assert not any(tmp_path.iterdir())
