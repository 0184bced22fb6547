#!/usr/bin/env bash
# The GPU check for the machine this project can be lent (the `device` tool: one H100 ~79 GiB or one H200
# ~139 GiB, the sweeps sized from the card; Python 3.12, torch,
# transformers, peft; no vLLM, Ray, DeepSpeed, OpenRLHF, FAISS or FastAPI; no network; 64 MiB carried;
# see docs/cluster.md, "Which GPU script"). Runs tests/gpu/device_check.py: CPU vs CUDA agreement on the
# tiny model, a Qwen2.5-3B-shaped learner sweep, the transformers engine at that shape and a
# Qwen2.5-7B-shaped reward backbone, under 8 minutes, results in $OUT/device_check.json. Exits non-zero
# when any part failed (an error, an out-of-memory of a whole part, a failed check, a part the budget skipped).
#
# Carried (both ignored by git; prepare them once on the CPU machine, docs/cluster.md):
#   .device/tiny-random-qwen2   the tiny model folder (cp -r ~/.cache/escrag/tiny-random-qwen2 .device/)
#   .whl/                       pydantic and its four small dependencies, for escrag.config (pip download)
# No pip install of the project: it runs from the working tree with PYTHONPATH=.
# Usage: bash tests/gpu/device_check.sh [OUT_DIR]   (default: $OUT, else runs/device-check; python: $PYTHON;
#   ONLY=agreement runs one part; a part past PART_TIMEOUT_S (120) prints every thread's stack)
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
DEST=${1:-${OUT:-runs/device-check}}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 USE_HUB_KERNELS=NO TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if ! "$PY" -c "import pydantic, yaml" 2>/dev/null; then
  if ! ls .whl/*.whl >/dev/null 2>&1; then
    echo "[device-check] FAIL: pydantic is not installed here and no .whl/ was carried (docs/cluster.md)"; exit 1
  fi
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
TINY=${TINY:-.device/tiny-random-qwen2}
[ -d "$TINY" ] || TINY=tiny-random:qwen2  # from $ESCRAG_CACHE
mkdir -p "$DEST"
"$PY" -c "import torch; print('[device-check]', torch.__version__, torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no CUDA')"
timeout 470 "$PY" tests/gpu/device_check.py --out "$DEST" --tiny "$TINY" --budget-s 380 \
  --part-timeout-s "${PART_TIMEOUT_S:-120}" ${ONLY:+--only "$ONLY"}
rc=$?
echo "[device-check] exit $rc; results in $DEST/device_check.json"
exit $rc
