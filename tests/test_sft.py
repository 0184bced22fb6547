"""Cold-start SFT (trainer/sft.py): bootstrapped ESConv demonstrations parse in the think/response
format, a bad demonstrations file is refused with file:line and the reason, the loss covers only the
assistant tokens (plus end-of-turn), and a short LoRA run on the tiny random Qwen2 lowers the loss and
saves a merged folder that ``escrag.models.load_causal_lm`` loads.
Run: .venv/bin/python -m pytest -q tests/test_sft.py   (~15 s)"""

import json

import pytest
import torch

from escrag.config import load_config
from escrag.data import load_states
from escrag.errors import UserError
from escrag.formats import parse_output
from trainer.sft import bootstrap_demonstrations, encode, load_demonstrations, train_sft

pytestmark = pytest.mark.unit


def test_bootstrapped_demonstrations_are_well_formed():
    states = load_states("train")[:200]
    demos = bootstrap_demonstrations(states, 20, seed=1)
    assert len(demos) == 20 and len({d["id"] for d in demos}) == 20
    for d in demos:
        parsed = parse_output(d["output"])
        assert parsed.ok and "Strategy:" in parsed.think and d["history"][-1]["role"] == "user"
    assert demos == bootstrap_demonstrations(states, 20, seed=1)  # seeded


@pytest.mark.parametrize("line, reason", [
    ("{not json", "invalid JSON"),
    ('{"history": [], "output": "x"}', "'history' must be a non-empty list"),
    ('{"history": [{"role": "assistant", "content": "hi"}], "output": "x"}', "must end with a user"),
    ('{"history": [{"role": "user", "content": "hi"}]}', "needs 'output'"),
    ('{"history": [{"role": "user", "content": "hi"}], "output": "<response>x</response>"}', "think/response format"),
])
def test_bad_demonstrations_are_named(tmp_path, line, reason):
    path = tmp_path / "demos.jsonl"
    path.write_text('{"history": [{"role": "user", "content": "hi"}], "think": "t", "response": "r"}\n' + line + "\n")
    with pytest.raises(UserError, match=rf"demos.jsonl:2: .*{reason}"):
        load_demonstrations(path)


def test_loss_only_on_assistant_tokens(tokenizer):
    demo = {"history": [{"role": "user", "content": "I feel alone."}],
            "output": "<think>lonely</think><response>I am here with you.</response>"}
    ids, labels = encode(tokenizer, demo, max_length=256, max_turns=None)
    target = [y for y in labels if y != -100]
    assert tokenizer.decode(target) == demo["output"] + tokenizer.eos_token
    assert labels[:len(ids) - len(target)] == [-100] * (len(ids) - len(target))
    short_ids, short_labels = encode(tokenizer, demo, max_length=24, max_turns=None)
    assert len(short_ids) == 24 and short_labels[-1] == tokenizer.eos_token_id  # prompt cut from the left


def _demos(tmp_path):
    demos = tmp_path / "demos.jsonl"
    rows = [{"history": [{"role": "user", "content": f"I lost my job {i}."}],
             "think": "job loss, reflect feelings", "response": "That sounds really hard."} for i in range(4)]
    demos.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(demos)


def test_full_sft_lowers_the_loss(tiny_model, tmp_path):
    cfg = load_config("configs/cpu-test.yaml", [f"policy.model={tiny_model}", "sft.lr=1e-2", "sft.max_steps=8"])
    out = train_sft(cfg, data=_demos(tmp_path), out=tmp_path / "sft", log=lambda *_: None)
    assert out["losses"][-1] < 0.7 * out["losses"][0], out["losses"]


def test_lora_sft_saves_a_loadable_merged_model(tiny_model, tmp_path):
    from escrag.models import load_causal_lm

    cfg = load_config("configs/cpu-test.yaml", [f"policy.model={tiny_model}", "policy.lora.enabled=true",
                                                "policy.lora.r=8", "sft.lr=3e-2", "sft.max_steps=2"])
    out = train_sft(cfg, data=_demos(tmp_path), out=tmp_path / "sft", log=lambda *_: None)
    merged, base = load_causal_lm(out["path"]), load_causal_lm(tiny_model)
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        assert not torch.allclose(merged(ids).logits, base(ids).logits)  # the adapter is merged in
    assert json.loads((tmp_path / "sft" / "escrag_meta.json").read_text())["stage"] == "sft"
