#!/usr/bin/env bash
# The paper's central claim on the embedded default (Table 2's rows at one budget), end to end:
#   bash experiments/central_claim/run.sh        (from the repository root, after `make install`)
# Every step is resumable: rerunning skips what is done (pipeline manifest, GRPO checkpoints, eval caches).
set -euo pipefail
cd "$(dirname "$0")/../.."
CFG=experiments/central_claim/config.yaml
OUT=runs/central-claim
RES=experiments/central_claim
PY=${PY:-.venv/bin/python}
export RAY_USAGE_STATS_ENABLED=0 RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
mkdir -p "$OUT"
: > "$RES/timings.tsv"
step() {  # name, command...: run it and record its wall time
  local name=$1; shift
  local t0=$SECONDS
  echo "=== $name: $*"
  "$@"
  printf '%s\t%d\n' "$name" $((SECONDS - t0)) | tee -a "$RES/timings.tsv"
}
# 1. silver pairs -> exemplar index -> reward head -> cold-start SFT -> ESCRAG-R1 (GRPO with retrieval)
step pipeline "$PY" -m escrag.cli pipeline --config $CFG
# 2. Vanilla GRPO: the same SFT start, reward, steps and seeds, no retrieval in training
step vanilla-grpo "$PY" -m escrag.cli grpo --config $CFG -o rollout.rag=false -o run.output_dir=$OUT/vanilla \
    -o policy.model=$OUT/sft
# 3. the offline proxy RM: silver pairs from train dialogues disjoint from the training RM's
step proxy-rm "$PY" -m escrag.cli eval proxy-rm --config $CFG --out $OUT/proxy-rm
# 4. answer 64 held-out test states with every system and score them with the proxy
step eval "$PY" -m escrag.cli eval --config $CFG -o run.output_dir=$OUT/eval
cp $OUT/eval/proxy.md $OUT/eval/proxy.csv "$RES/"
for r in grpo vanilla; do cp $OUT/$r/metrics.jsonl "$RES/metrics-$r.jsonl"; cp $OUT/$r/reward_curve.png "$RES/curve-$r.png"; done
echo "table: $RES/proxy.md; timings: $RES/timings.tsv"
