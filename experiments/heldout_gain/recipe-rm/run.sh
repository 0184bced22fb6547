#!/usr/bin/env bash
# Issue 12's GRPO recipe trained against the reward head chosen in experiments/reward_recipe/, then judged
# on fresh test states by the training RM and by the MiniLM proxy it was not trained on (README.md here).
#   bash experiments/heldout_gain/recipe-rm/run.sh      (from the repository root, after `make install`)
#   SEED=1 bash experiments/heldout_gain/recipe-rm/run.sh   (the whole pipeline reseeded: pairs, RM, SFT, GRPO;
#                                                        the same test states; results in seed-1/)
# Resumable like the demo (pipeline manifest, GRPO checkpoints). Outputs: runs/heldout-gain-recipe-rm/, copied here.
set -euo pipefail
cd "$(dirname "$0")/../../.."
CFG=experiments/heldout_gain/recipe-rm/config.yaml
SEED=${SEED:-0}
OUT=runs/heldout-gain-recipe-rm
RES=experiments/heldout_gain/recipe-rm
if [ "$SEED" != 0 ]; then OUT=$OUT-seed-$SEED; RES=$RES/seed-$SEED; mkdir -p "$RES"; fi
SEEDED=(-o run.seed="$SEED" -o run.output_dir="$OUT")
PY=${PY:-.venv/bin/python}
export RAY_USAGE_STATS_ENABLED=0 RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
t0=$SECONDS
# train (pairs -> index -> RM -> SFT -> GRPO); the comparison runs below, on states no recipe was chosen on
"$PY" -m ray_jobs.demo --config $CFG "${SEEDED[@]}" -o run.demo_compare_states=0 2>&1 | tee "$OUT.train.log"
printf 'train\t%d\n' $((SECONDS - t0)) > "$RES/timings.tsv"
t0=$SECONDS
# test: run.seed 2 draws the 64 states and the answers' seeds (seeds 0 and 1 drew the earlier comparisons')
"$PY" -m ray_jobs.demo --config $CFG --compare-only -o run.output_dir="$OUT" -o run.seed=2 -o run.demo_compare_states=64 \
  -o run.demo_compare_samples=2 2>&1 | tee "$RES/compare.log"
printf 'compare\t%d\n' $((SECONDS - t0)) >> "$RES/timings.tsv"
t0=$SECONDS
"$PY" -m escrag eval labels --config $CFG --rm training_rm=$OUT/rm --answers $OUT/grpo/compare-test.jsonl \
  --out "$RES/labels-answers.json"
printf 'labels\t%d\n' $((SECONDS - t0)) >> "$RES/timings.tsv"
cp $OUT/grpo/compare-test.json $OUT/grpo/compare-test.jsonl $OUT/grpo/metrics.jsonl $OUT/grpo/reward_curve.png "$RES/"
