#!/usr/bin/env bash
# Issue 53, item 2: a reward worth optimising on the CPU. Features once (train and valid only), the recipe
# chosen on valid, then the embedded default's reward head (configs/cpu-demo.yaml, as the demo's
# ray_jobs.train_rm trains it) scored once on the 176 surveyed test dialogues.
#   bash experiments/reward_recipe/run.sh          (from the repository root)
# The committed JSON ran with features.py's defaults (300 train states, 60 valid states for the generic check);
# first-search/ holds the first search's files (FEATURE_ARGS="--no-lock --train-states 100 --valid-generic-states 20").
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
HERE=experiments/reward_recipe
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
t0=$SECONDS
# shellcheck disable=SC2086
"$PY" -m experiments.reward_recipe.features ${FEATURE_ARGS:-}
printf 'features\t%d\n' $((SECONDS - t0)) > $HERE/timings.tsv
t0=$SECONDS
"$PY" -m experiments.reward_recipe.search
printf 'search\t%d\n' $((SECONDS - t0)) >> $HERE/timings.tsv
t0=$SECONDS
# the demo's RM stage exactly: its silver pairs and its head (configs/cpu-demo.yaml's reward section)
flock /tmp/escrag-heavy.lock "$PY" -m ray_jobs.train_rm --config configs/cpu-demo.yaml \
  -o run.output_dir=runs/reward_recipe/demo --out runs/reward_recipe/demo/rm
cp runs/reward_recipe/demo/rm/metrics.json $HERE/rm-metrics.json
printf 'train_rm\t%d\n' $((SECONDS - t0)) >> $HERE/timings.tsv
t0=$SECONDS
# valid first: the demo's head (bfloat16 where the CPU has it, 90% of the pairs) against the search's float32 number
flock /tmp/escrag-heavy.lock "$PY" -m escrag eval labels --config experiments/heldout_gain/config.yaml \
  -o eval.labels.states_per_dialogue=1 --rm embedded_default=runs/reward_recipe/demo/rm --split valid \
  --generic $HERE/generic_eval.txt --out $HERE/labels-valid.json
printf 'labels_valid\t%d\n' $((SECONDS - t0)) >> $HERE/timings.tsv
t0=$SECONDS
# test, once: the same 176 states as experiments/reward_labels (seed 0, one state per dialogue)
flock /tmp/escrag-heavy.lock "$PY" -m escrag eval labels --config experiments/heldout_gain/config.yaml \
  -o eval.labels.states_per_dialogue=1 --rm embedded_default=runs/reward_recipe/demo/rm --split test \
  --generic $HERE/generic_eval.txt --out $HERE/labels-test.json
printf 'labels_test\t%d\n' $((SECONDS - t0)) >> $HERE/timings.tsv
