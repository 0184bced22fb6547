"""Prompts render through the real SmolLM2 chat template; model specs resolve (tiny random model is
seeded and identical across builds; bad specs fail clearly); the CLI reports data stats.
Run: .venv/bin/python -m pytest -q tests/test_prompts_models.py"""

import subprocess
import sys

import pytest
import torch

from escrag import prompts
from escrag.config import RetrieverConfig
from escrag.models import ModelSpecError, load_causal_lm, resolve_model

HISTORY = [{"role": "user", "content": "I lost my job."}, {"role": "assistant", "content": "I'm sorry."},
           {"role": "user", "content": "I feel worthless."}]
EXEMPLARS = [{"history": "Client: I was fired.", "response": "That must hurt.", "strategies": ["Reflection of feelings"],
              "stage": "", "problem": "job crisis", "emotion": "sadness"},
             {"history": "Client: I failed.", "response": "You are more than one result.", "stage": "",
              "strategies": ["Affirmation and Reassurance", "Question"], "problem": "academic pressure", "emotion": ""}]


def test_stage1_prompt_renders_history_and_format_rule(tokenizer):
    text = prompts.render(tokenizer, prompts.stage1_messages(HISTORY))
    assert text.count("<|im_start|>user") == 2 and text.count("<|im_start|>assistant") == 2
    assert text.rstrip().endswith("<|im_start|>assistant")  # generation prompt
    assert "<think></think>" in text and "<response></response>" in text
    assert text.index("I lost my job.") < text.index("I feel worthless.")


def test_stage2_prompt_continues_stage1_with_the_draft_and_exemplars(tokenizer):
    msgs = prompts.stage2_messages(HISTORY, "  My draft reply. ", EXEMPLARS, max_turns=1)
    text = prompts.render(tokenizer, msgs)
    assert "My draft reply." in text and "[Exemplar 2]" in text and "You are more than one result." in text
    assert ("[Exemplar 1] Strategy: Reflection of feelings. Problem: job crisis. Emotion: sadness.\n"
            "Client: I was fired.\nCounselor: That must hurt.") in text  # each exemplar shows its labels
    assert "[Exemplar 2] Strategy: Affirmation and Reassurance, Question. Problem: academic pressure.\n" in text
    assert "I lost my job." not in text  # max_turns=1 keeps only the last client turn
    assert msgs[:-2] == prompts.stage1_messages(HISTORY, max_turns=1)  # stage 2 continues stage 1
    assert msgs[-2] == {"role": "assistant", "content": "My draft reply."}
    assert msgs[-1] == prompts.feedback_message(EXEMPLARS) and msgs[-1]["role"] == "system"
    assert text.endswith("<|im_start|>assistant\n")


def test_rm_text_ends_with_candidate_reply(tokenizer):
    text = prompts.render(tokenizer, prompts.rm_messages(HISTORY, "It is okay to feel that."),
                          add_generation_prompt=False)
    assert text.rstrip().endswith("It is okay to feel that.<|im_end|>")


def test_chunk_text_is_short():
    long = [{"role": "user", "content": "x" * 2000}]
    rc = RetrieverConfig()
    hist = prompts.chunk_history(HISTORY[:2] + long, rc.chunk_turns, rc.chunk_chars)
    assert len(hist) <= 404 and hist.startswith("...")
    assert prompts.chunk_text("Client: hi", "hello") == "Client: hi\nCounselor: hello"


def test_tiny_random_is_seeded_and_loads(tiny_model):
    model = load_causal_lm(tiny_model)
    assert model.config.hidden_size == 64 and model.config.num_hidden_layers == 2
    again = load_causal_lm("tiny-random:qwen2")
    for (n, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), n


@pytest.mark.parametrize("spec,needle", [
    ("", "non-empty"), ("packaged:gpt5", "unknown packaged model"),
    ("tiny-random:mamba", "unknown tiny architecture"), ("./no/such/dir", "no such model folder"),
])
def test_bad_specs(spec, needle):
    with pytest.raises(ModelSpecError, match=needle):
        resolve_model(spec)


def test_packaged_minilm_resolves_to_folder():
    from pathlib import Path

    assert (Path(resolve_model("packaged:minilm")) / "config.json").exists()


@pytest.mark.slow
def test_packaged_smollm2_is_a_safetensors_folder():
    from pathlib import Path

    path = Path(resolve_model("packaged:smollm2-135m-instruct"))
    assert (path / "model.safetensors").exists() and (path / ".complete").exists()
    model = load_causal_lm(str(path))
    assert 130e6 < sum(p.numel() for p in model.parameters()) < 140e6


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "escrag", *args], capture_output=True, text=True)


def test_cli_data_stats_reports_paper_split():
    out = run_cli("data", "stats")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    for split, n in (("train", 910), ("valid", 195), ("test", 195)):
        assert any(line.startswith(f"{split}:") and f"{n} dialogues" in line for line in lines)


def test_cli_bad_split_is_one_line_error():
    out = run_cli("data", "stats", "--split", "/no/such.jsonl")
    assert out.returncode == 2 and "no such ESConv file" in out.stderr and "Traceback" not in out.stderr
