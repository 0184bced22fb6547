#!/usr/bin/env bash
# Issue 26 items 2-3: the training reward, the SmolLM2 proxy RM and the independent MiniLM proxy
# against ESConv's human labels on held-out test dialogues. Needs the reward head of
# experiments/heldout_gain (runs/heldout-gain/rm: bash experiments/heldout_gain/run.sh, or its first stages).
#   bash experiments/reward_labels/run.sh          (from the repository root)
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
CFG=experiments/heldout_gain/config.yaml
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
t0=$SECONDS
"$PY" -m escrag eval proxy-rm --config $CFG -o eval.proxy.training_rm_dir=runs/heldout-gain/rm \
  --out runs/heldout-gain/proxy-rm
printf 'proxy-rm\t%d\n' $((SECONDS - t0)) > experiments/reward_labels/timings.tsv
t0=$SECONDS
# one gold turn per dialogue (176 test dialogues): each SmolLM2 pass took ~1 s on the shared 2-core machine
"$PY" -m escrag eval labels --config $CFG -o eval.labels.states_per_dialogue=1 --rm training_rm=runs/heldout-gain/rm \
  --rm smollm2_proxy_rm=runs/heldout-gain/proxy-rm --split test --out experiments/reward_labels/labels-test.json
printf 'labels\t%d\n' $((SECONDS - t0)) >> experiments/reward_labels/timings.tsv
