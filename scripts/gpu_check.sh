#!/usr/bin/env bash
# The one script run on the GPU machine: build the extension for that GPU, generate synthetic
# checkpoints, run the cuda tests, run the decode benchmark. Logs under $OUT (or ./gpu-out).
# Usage: scripts/gpu_check.sh [all|build|test|bench] [pytest -k expression]
# HEARTH_TEST_TIMEOUT / HEARTH_BENCH_TIMEOUT (seconds) bound the two long steps, so one device call
# of at most 10 minutes always ends with its summary.
set -uo pipefail
STEP=${1:-all}
KEXPR=${2:-}
OUT=${OUT:-$PWD/gpu-out}
MODELS=${HEARTH_CUDA_MODELS:-/tmp/hearth-models}
export HEARTH_CUDA_MODELS=$MODELS PYTHONUNBUFFERED=1
export HEARTH_CUDA_ARCHITECTURES=${HEARTH_CUDA_ARCHITECTURES:-90}
mkdir -p "$OUT" "$MODELS"
summary=()

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"

if [[ $STEP == all || $STEP == build ]]; then
  start=$(date +%s)
  python3 -m pip install --no-build-isolation --no-deps -v -e . >"$OUT/build.log" 2>&1
  rc=$?
  summary+=("build rc=$rc in $(( $(date +%s) - start )) s")
  [[ $rc -ne 0 ]] && { tail -40 "$OUT/build.log"; echo "${summary[@]}"; exit 1; }
  python3 -c "import engine._native as n; print(n.build_info()); from engine.backends import cuda_native as c; c._preload_cublaslt(); print('available', c.available(), 'cublasLt', n.cublaslt_available())" 2>&1 | tee -a "$OUT/build.log"
fi

if [[ $STEP == all || $STEP == test || $STEP == bench ]]; then
  for shape in smollm2-135m llama3.2-1b qwen3-0.6b llama3.1-8b; do
    [[ -f $MODELS/$shape/config.json ]] || python3 -m engine.tools.synth --shape "$shape" --out "$MODELS/$shape" >>"$OUT/synth.log" 2>&1
  done
fi

if [[ $STEP == all || $STEP == test ]]; then
  args=(-m cuda tests/cuda -q -rs -s --durations=10 --junitxml="$OUT/junit.xml")
  [[ -n $KEXPR ]] && args+=(-k "$KEXPR")
  timeout "${HEARTH_TEST_TIMEOUT:-330}" python3 -m pytest "${args[@]}" >"$OUT/pytest.log" 2>&1
  rc=$?
  summary+=("pytest rc=$rc: $(tail -1 "$OUT/pytest.log")")
  grep -E "^\[|FAILED|Error" "$OUT/pytest.log" | head -60
fi

if [[ $STEP == all || $STEP == bench ]]; then
  timeout "${HEARTH_BENCH_TIMEOUT:-200}" python3 -m engine.bench --hf --torch --tokens 128 --json "$OUT/bench.json" \
    --model "$MODELS/smollm2-135m" --model "$MODELS/llama3.2-1b" --model "$MODELS/llama3.1-8b" \
    >"$OUT/bench.log" 2>&1
  summary+=("bench rc=$?")
  grep -v '^{' "$OUT/bench.log" | tail -20
fi

echo "=== summary ==="
printf '%s\n' "${summary[@]}"
