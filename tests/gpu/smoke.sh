#!/usr/bin/env bash
# One-GPU smoke of both training backends (issue 11), under 8 minutes, printing PASS/FAIL per part and
# the step times:
#   1. openrlhf: 2 GRPO steps of OpenRLHF's Ray trainer (vLLM engine, DeepSpeed actor and reference
#      colocated on the GPU) driving trainer/openrlhf/agent.py, tiny random Qwen2 in bf16;
#   2. local: 2 steps of our own job with the vLLM rollout engine on the GPU.
# Both use a 40-chunk ESConv index and the `length:8` rule reward server (real processes on loopback).
#
# Needs: one CUDA GPU and the cluster environment (`pip install -e '.[cluster]'` inside OpenRLHF's
# recommended image, docs/cluster.md), run from the repository root. No network: the tiny model comes
# from $ESCRAG_CACHE (default ~/.cache/escrag; carry its tiny-random-qwen2 folder, 16 MB, if the
# machine has no copy). Usage: bash tests/gpu/smoke.sh [RUN_DIR]    (python: $PYTHON, default python3)
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
RUN=$(realpath -m "${1:-runs/gpu-smoke}")
export RAY_USAGE_STATS_ENABLED=0 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
mkdir -p "$RUN/logs"
T0=$(date +%s)
declare -A RESULT
PIDS=()

stop_servers() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done; }
trap stop_servers EXIT

preflight() {
  "$PY" - <<'EOF' || return 1
import importlib.metadata as m, torch
assert torch.cuda.is_available(), "no CUDA device"
import vllm, deepspeed, ray, openrlhf  # noqa: F401
print("[smoke]", torch.cuda.get_device_name(0), "| torch", torch.__version__,
      "| " + " ".join(f"{p} {m.version(p)}" for p in ("vllm", "deepspeed", "ray", "openrlhf", "transformers")))
EOF
}

serve() {  # VAR name args... : start `escrag serve args`, set VAR to its URL once /health answers
  local var=$1 name=$2; shift 2
  local port
  port=$("$PY" -c 'from escrag.web.procs import free_port; print(free_port())')
  "$PY" -m escrag serve "$@" --port "$port" >"$RUN/logs/$name.log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 1 240); do
    if "$PY" -c "import httpx,sys; sys.exit(httpx.get('http://127.0.0.1:$port/health', timeout=2).status_code != 200)" 2>/dev/null; then
      printf -v "$var" 'http://127.0.0.1:%s' "$port"; return 0
    fi
    sleep 0.5
  done
  echo "[smoke] FAIL: $name server did not come up (log $RUN/logs/$name.log)"; return 1
}

part() {  # name timeout-seconds command... ; PASS when the command exits 0 within the time
  local name=$1 limit=$2; shift 2
  local t=$(date +%s)
  echo "[smoke] --- $name: $*"
  if timeout "$limit" "$@" >"$RUN/logs/$name.log" 2>&1; then RESULT[$name]=PASS; else RESULT[$name]="FAIL (exit $?)"; fi
  echo "[smoke] $name: ${RESULT[$name]} in $(( $(date +%s) - t )) s; log $RUN/logs/$name.log"
}

if ! preflight; then
  echo "[smoke] FAIL: preflight (needs CUDA and the cluster extra: pip install -e '.[cluster]')"; exit 1
fi
TINY=$("$PY" -c 'from escrag.models import resolve_model; print(resolve_model("tiny-random:qwen2"))') || exit 1
"$PY" -m escrag index build --source esconv --out "$RUN/index" --limit 40 >"$RUN/logs/index.log" 2>&1 \
  || { echo "[smoke] FAIL: index build (log $RUN/logs/index.log)"; exit 1; }
serve RET retriever retriever --index "$RUN/index" || exit 1
serve REW reward reward --rule length:8 || exit 1
COMMON=(--config configs/gpu-smoke.yaml -o "retriever.url=$RET" -o "reward.url=$REW")

part openrlhf 300 "$PY" -m ray_jobs.train_grpo --backend openrlhf --policy "$TINY" "${COMMON[@]}" \
  -o "run.output_dir=$RUN/openrlhf"
[[ ${RESULT[openrlhf]} == PASS && ! -f "$RUN/openrlhf/policy/config.json" ]] && RESULT[openrlhf]="FAIL (no final policy)"
part local 240 "$PY" -m ray_jobs.train_grpo "${COMMON[@]}" -o "policy.model=$TINY" -o "run.output_dir=$RUN/local"

echo "[smoke] step times"
grep -o "Global step [0-9]*.*'timing/step_total': [0-9.]*" "$RUN/logs/openrlhf.log" \
  | sed -E "s/Global step ([0-9]+).*'timing\/step_total': ([0-9.]+)/  openrlhf step \1: \2 s/" || true
"$PY" - "$RUN/local/metrics.jsonl" <<'EOF' || true
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(f"  local step {r['step']}: generate {r['gen_s']:.1f} s, update {r['update_s']:.1f} s, "
          f"reward {r.get('reward_mean', 0):.3f}")
EOF
status=0
for name in openrlhf local; do
  echo "[smoke] $name: ${RESULT[$name]}"
  [[ ${RESULT[$name]} == PASS ]] || status=1
done
echo "[smoke] total $(( $(date +%s) - T0 )) s"
exit $status
