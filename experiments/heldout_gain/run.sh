#!/usr/bin/env bash
# Issue 12's recipe: GRPO beats its SFT start on held-out states beyond the noise (README.md here).
#   bash experiments/heldout_gain/run.sh [-o key=value ...]   (from the repository root, after `make install`)
#   on an AVX2-only CPU: bash experiments/heldout_gain/run.sh -o policy.dtype=float32
# The demo's whole path on this config (pairs -> index -> RM -> SFT -> GRPO -> held-out SFT vs GRPO);
# resumable like the demo (pipeline manifest, GRPO checkpoints). Outputs: runs/heldout-gain/, copied here.
set -euo pipefail
cd "$(dirname "$0")/../.."
CFG=experiments/heldout_gain/config.yaml
OUT=runs/heldout-gain
RES=experiments/heldout_gain
PY=${PY:-.venv/bin/python}
export RAY_USAGE_STATS_ENABLED=0 RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
t0=$SECONDS
"$PY" -m ray_jobs.demo --config $CFG "$@" 2>&1 | tee "$RES/demo.log"
printf 'demo\t%d\n' $((SECONDS - t0)) > "$RES/timings.tsv"
cp $OUT/grpo/compare-test.json $OUT/grpo/compare-test.jsonl $OUT/grpo/metrics.jsonl $OUT/grpo/reward_curve.png "$RES/"
echo "held-out comparison: $RES/compare-test.json (answers: compare-test.jsonl); timings: $RES/timings.tsv"
