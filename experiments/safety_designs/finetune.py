"""Issue 15, design study 2: does fine-tuning the conversation head's backbone generalise better?

Run (from the repository root, after ``make install``; ~20 min alone on 2 cores):
    .venv/bin/python experiments/safety_designs/finetune.py [--epochs 2] [--rank 8] [--lr 2e-4]
Writes experiments/safety_designs/finetune.json and prints the table.

The same fit / dev split as study.py (fit = tuning.jsonl + round 6's even groups; dev = round 6's odd
groups, fitted on by nothing); the evaluation set is never opened. The design: the shipped
conversation head (escrag/safety/heads.py: SmolLM2-135M-Instruct states after layers 8, 16, 24,
averaged over the rendered conversation, then a softmax regression) as the starting point, then LoRA
adapters on every projection of every layer and the regression trained together on the fit cases
(class-balanced cross-entropy, bfloat16 autocast over float32 weights). Dev AUC and recall per
category / not-high flagged at fixed P(high) thresholds, before and after each epoch.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(ROOT), str(HERE)]

from study import scores  # noqa: E402

from escrag.atomic import write_json  # noqa: E402
from escrag.config import SafetyConfig  # noqa: E402
from escrag.safety.backbone import render  # noqa: E402
from escrag.safety.cases import (  # noqa: E402
    case_labels,
    dev_group,
    fit_cases,
    load_cases,  # noqa: E402
)
from escrag.safety.classifier import RiskClassifier  # noqa: E402
from escrag.safety.types import CATEGORIES  # noqa: E402

OUT = HERE / "finetune.json"


class Model:
    """The backbone with LoRA adapters and the head as a linear layer on the pooled states."""

    def __init__(self, clf: RiskClassifier, rank: int):
        import torch
        from peft import LoraConfig, get_peft_model

        bb, head = clf.backbone, clf.conv
        self.tok, self.layers, self.torch = bb.tok, bb.layers, torch
        targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
        self.lm = get_peft_model(bb.lm, LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.05,
                                                   target_modules=targets))
        w = torch.tensor(head.weight / head.scale[:, None])  # standardisation folded into the linear
        self.linear = torch.nn.Linear(w.shape[0], w.shape[1])
        with torch.no_grad():
            self.linear.weight.copy_(w.T)
            self.linear.bias.copy_(torch.tensor(head.bias - (head.mean / head.scale) @ head.weight))

    def params(self):
        return [p for p in self.lm.parameters() if p.requires_grad] + list(self.linear.parameters())

    def logits(self, histories: list[list[dict]]):
        torch = self.torch
        enc = self.tok([render(h) for h in histories], return_tensors="pt", padding=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            hs = self.lm(**enc, output_hidden_states=True).hidden_states
        mask = enc.attention_mask.unsqueeze(-1).float()
        pooled = torch.cat([(hs[k].float() * mask).sum(1) / mask.sum(1) for k in self.layers], dim=1)
        return self.linear(pooled)

    def p_high(self, cases: list[dict], batch: int = 16) -> np.ndarray:
        torch, out = self.torch, np.zeros(len(cases), np.float32)
        order = sorted(range(len(cases)), key=lambda i: len(render(cases[i]["messages"])))
        self.lm.eval()
        with torch.no_grad():
            for s in range(0, len(order), batch):
                idx = order[s:s + batch]
                p = self.logits([cases[i]["messages"] for i in idx]).softmax(-1)[:, 0]
                out[idx] = 1.0 - p.numpy()
        return out


def batches(cases: list[dict], size: int, rng: random.Random) -> list[list[dict]]:
    """Shuffled batches of similar length (length-sorted chunks of 8 batches, then shuffled)."""
    order = cases[:]
    rng.shuffle(order)
    out = []
    for s in range(0, len(order), 8 * size):
        chunk = sorted(order[s:s + 8 * size], key=lambda c: len(render(c["messages"])))
        out += [chunk[i:i + size] for i in range(0, len(chunk), size)]
    rng.shuffle(out)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--max-cases", type=int, default=None, help="fit on the first N (a smoke run)")
    args = p.parse_args()
    import torch

    from escrag.progress import progress_bar

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    t0, rng = time.time(), random.Random(0)
    sc = SafetyConfig()
    fit = fit_cases(sc)[1][:args.max_cases]
    dev = [c for c in load_cases("tuning-round6") if dev_group(c)]
    yf, yd = case_labels(fit), case_labels(dev)
    counts = np.bincount(yf, minlength=len(CATEGORIES) + 1).clip(min=1)
    weight = torch.tensor(len(yf) / (len(counts) * counts), dtype=torch.float32)
    model = Model(RiskClassifier.from_config(sc), args.rank)
    report = {"args": vars(args), "fit_cases": len(fit), "dev_cases": len(dev), "epochs": {}}
    report["epochs"][0] = scores(model.p_high(dev), yd)
    print(f"epoch 0: dev AUC {report['epochs'][0]['auc']}", flush=True)
    opt = torch.optim.AdamW(model.params(), lr=args.lr, weight_decay=0.0)
    label_of = {id(c): int(y) for c, y in zip(fit, yf)}
    for epoch in range(1, args.epochs + 1):
        model.lm.train()
        losses = []
        for b in progress_bar(batches(fit, args.batch, rng), desc=f"epoch {epoch}", unit="batch"):
            y = torch.tensor([label_of[id(c)] for c in b])
            loss = torch.nn.functional.cross_entropy(model.logits([c["messages"] for c in b]), y, weight=weight)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        report["epochs"][epoch] = {"train_loss": round(float(np.mean(losses)), 4), **scores(model.p_high(dev), yd)}
        print(f"epoch {epoch}: loss {np.mean(losses):.4f}, dev AUC {report['epochs'][epoch]['auc']}", flush=True)
    report["seconds"] = round(time.time() - t0)
    write_json(OUT, report, indent=1)
    print(f"{'epoch':>5s} {'AUC':>6s} {'t':>5s}  " + " ".join(f"{c[:9]:>9s}" for c in CATEGORIES) + "  flagged")
    for epoch, s in report["epochs"].items():
        for t in (0.5, 0.7, 0.85, 0.95):
            r = s[f"t={t}"]
            print(f"{epoch:>5} {s['auc']:6.3f} {t:5.2f}  " + " ".join(f"{r['recall'][c]:9.2f}" for c in CATEGORIES)
                  + f"  {r['not_high_flagged_high']:.3f}")
    print(f"wrote {OUT} ({report['seconds']} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
