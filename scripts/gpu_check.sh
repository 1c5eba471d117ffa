#!/usr/bin/env bash
# The one script run on the GPU machine: build the extension for that GPU, generate synthetic
# checkpoints, run the cuda tests, run the decode benchmark. Logs under $OUT (or ./gpu-out).
# Usage: scripts/gpu_check.sh [all|build|test|bench] [pytest -k expression]
# HEARTH_TEST_TIMEOUT / HEARTH_BENCH_TIMEOUT (seconds) bound the long
# steps, so one device call of at most 10 minutes always ends with its summary.
# HEARTH_SYNTH_SHAPES: the checkpoints to generate (default all four; "" for none).
# HEARTH_PROFILE_MODELS / HEARTH_PRECISION_MODELS: shapes (among those generated) for the optional
# per-kernel decode profile and matrix-product precision steps (timeouts HEARTH_PROFILE_TIMEOUT, 120 s,
# and HEARTH_PRECISION_TIMEOUT, 150 s); both run with the bench step.
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
  # Wheels the GPU machine lacks (no registry there), carried in .whl/: scripts/device_wheels.sh.
  if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install --no-deps --no-index .whl/*.whl >"$OUT/wheels.log" 2>&1
    summary+=("wheels rc=$?")
  fi
  python3 -m pip install --no-build-isolation --no-deps -v -e . >"$OUT/build.log" 2>&1
  rc=$?
  summary+=("build rc=$rc in $(( $(date +%s) - start )) s")
  [[ $rc -ne 0 ]] && { tail -40 "$OUT/build.log"; echo "${summary[@]}"; exit 1; }
  python3 -c "import engine._native as n; print(n.build_info()); from engine.backends import cuda_native as c; c._preload_cublaslt(); print('available', c.available(), 'cublasLt', n.cublaslt_available())" 2>&1 | tee -a "$OUT/build.log"
fi

if [[ $STEP == all || $STEP == test || $STEP == bench ]]; then
  for shape in ${HEARTH_SYNTH_SHAPES-smollm2-135m llama3.2-1b qwen3-0.6b llama3.1-8b}; do
    [[ -f $MODELS/$shape/config.json ]] || python3 -m engine.tools.synth --shape "$shape" --out "$MODELS/$shape" >>"$OUT/synth.log" 2>&1
  done
  # HEARTH_NVFP4_SHAPES: NVFP4 checkpoints (random codes and scales) at $MODELS/<shape>-nvfp4.
  for shape in ${HEARTH_NVFP4_SHAPES-llama3.2-1b llama3.1-8b}; do
    [[ -f $MODELS/$shape-nvfp4/config.json ]] || python3 -m engine.tools.synth --shape "$shape" --nvfp4 --out "$MODELS/$shape-nvfp4" >>"$OUT/synth.log" 2>&1
  done
  # HEARTH_MOE_SHAPES: mixture-of-experts checkpoints for the bench, "<shape>" (bf16, at $MODELS/<shape>)
  # or "<shape>:nvfp4" (at $MODELS/<shape>-nvfp4). Qwen3-30B-A3B in NVFP4 is 18 GB of the 64 GB disk.
  moe_dirs=()
  for spec in ${HEARTH_MOE_SHAPES-qwen3-30b-a3b:nvfp4}; do
    shape=${spec%%:*}
    if [[ $spec == *:nvfp4 ]]; then dir=$MODELS/$shape-nvfp4; flag=(--nvfp4); else dir=$MODELS/$shape; flag=(); fi
    [[ -f $dir/config.json ]] || python3 -m engine.tools.synth --shape "$shape" "${flag[@]}" --out "$dir" >>"$OUT/synth.log" 2>&1
    moe_dirs+=(--model "$dir")
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
  # HEARTH_BENCH_ARGS: peers to bench beside cuda-native (default --hf --torch; "" for none) and
  # --precision exact to measure the exact precision too (--precision fast --precision exact).
  read -r -a bench_args <<<"${HEARTH_BENCH_ARGS---hf --torch}"
  # HEARTH_BENCH_MODELS: the shapes to bench (default all three; "" for none).
  model_args=()
  for shape in ${HEARTH_BENCH_MODELS-smollm2-135m llama3.2-1b llama3.1-8b}; do model_args+=(--model "$MODELS/$shape"); done
  if [[ ${#model_args[@]} -gt 0 ]]; then
    timeout "${HEARTH_BENCH_TIMEOUT:-200}" python3 -m engine.bench "${bench_args[@]}" --tokens 128 --json "$OUT/bench.json" \
      "${model_args[@]}" >"$OUT/bench.log" 2>&1
    summary+=("bench rc=$?")
    grep -v '^{' "$OUT/bench.log" | tail -20
  fi
  # The NVFP4 checkpoints alone (no peer here loads them: transformers needs ModelOpt's kernels).
  model_args=()
  for shape in ${HEARTH_NVFP4_SHAPES-llama3.2-1b llama3.1-8b}; do model_args+=(--model "$MODELS/$shape-nvfp4"); done
  if [[ ${#model_args[@]} -gt 0 ]]; then
    timeout "${HEARTH_BENCH_NVFP4_TIMEOUT:-150}" python3 -m engine.bench --tokens 128 --json "$OUT/bench_nvfp4.json" \
      "${model_args[@]}" >"$OUT/bench_nvfp4.log" 2>&1
    summary+=("bench nvfp4 rc=$?")
    grep -v '^{' "$OUT/bench_nvfp4.log" | tail -12
  fi
  # The mixture-of-experts checkpoints (the roofline counts the experts a token reads).
  if [[ ${#moe_dirs[@]} -gt 0 ]]; then
    timeout "${HEARTH_BENCH_MOE_TIMEOUT:-200}" python3 -m engine.bench --tokens 128 --json "$OUT/bench_moe.json" \
      "${moe_dirs[@]}" >"$OUT/bench_moe.log" 2>&1
    summary+=("bench moe rc=$?")
    grep -v '^{' "$OUT/bench_moe.log" | tail -12
  fi
fi

# Optional: `hearth bench --serve` (aggregate decode over HTTP on 127.0.0.1 against in-process batching,
# at 8 and 32 clients) on the shapes in HEARTH_SERVE_MODELS, each with a byte tokenizer beside its
# weights. Needs the server's wheels in .whl/ (scripts/device_wheels.sh), installed by the build step.
# Where $MODELS/<shape> was generated above (same seed, so the same weights), <shape>-tok links its weight
# files and only writes the tokenizer (the 8B: no second 16 GB on disk); otherwise synth writes it whole.
if [[ ($STEP == all || $STEP == bench) && -n ${HEARTH_SERVE_MODELS:-} ]]; then
  for shape in $HEARTH_SERVE_MODELS; do
    dir=$MODELS/$shape-tok
    if [[ ! -f $dir/config.json && -f $MODELS/$shape/config.json ]]; then
      mkdir -p "$dir" && ln -sf "$MODELS/$shape"/*.safetensors "$dir"/ &&
        cp "$MODELS/$shape"/*.json "$dir"/ &&
        python3 -c "import sys, pathlib; from engine.tools.synth import write_byte_tokenizer as w; w(pathlib.Path(sys.argv[1]))" \
          "$dir" >>"$OUT/synth.log" 2>&1 || rm -rf "$dir"
    fi
    [[ -f $dir/config.json ]] || python3 -m engine.tools.synth --shape "$shape" --tokenizer --out "$dir" >>"$OUT/synth.log" 2>&1
    timeout "${HEARTH_SERVE_TIMEOUT:-240}" python3 -m engine bench --serve --backend cuda-native --model "$dir" \
      --clients 8 32 >>"$OUT/bench_serve.log" 2>&1
    summary+=("bench serve $shape rc=$?")
  done
  tail -12 "$OUT/bench_serve.log"
fi

# Optional: per-kernel decode profile (graphs on and off) of the shapes in HEARTH_PROFILE_MODELS
# (e.g. "smollm2-135m llama3.1-8b"); HEARTH_PROFILE_ARGS adds e.g. "--batch 8 --context 1024".
if [[ ($STEP == all || $STEP == bench) && -n ${HEARTH_PROFILE_MODELS:-} ]]; then
  read -r -a profile_args <<<"${HEARTH_PROFILE_ARGS:-}"
  model_args=()
  for shape in $HEARTH_PROFILE_MODELS; do model_args+=(--model "$MODELS/$shape"); done
  timeout "${HEARTH_PROFILE_TIMEOUT:-120}" python3 -m engine.tools.profile_decode "${model_args[@]}" "${profile_args[@]}" \
    --json "$OUT/profile.json" >"$OUT/profile.log" 2>&1
  summary+=("profile rc=$?")
  tail -60 "$OUT/profile.log"
fi

# Optional: how far bf16 / fp16 / scaled-fp16 products move the logits of the shapes in
# HEARTH_PRECISION_MODELS (torch reference in fp32 on the GPU: the 8B needs ~32 GB).
if [[ ($STEP == all || $STEP == bench) && -n ${HEARTH_PRECISION_MODELS:-} ]]; then
  model_args=()
  for shape in $HEARTH_PRECISION_MODELS; do model_args+=(--model "$MODELS/$shape"); done
  timeout "${HEARTH_PRECISION_TIMEOUT:-150}" python3 -m engine.tools.precision --device cuda "${model_args[@]}" \
    --json "$OUT/precision.json" >"$OUT/precision.log" 2>&1
  summary+=("precision rc=$?")
  tail -40 "$OUT/precision.log"
fi

echo "=== summary ==="
printf '%s\n' "${summary[@]}"
