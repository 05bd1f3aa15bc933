#!/usr/bin/env bash
# The GPU check in one command, for a machine with a CUDA GPU, a PyTorch 2.x with CUDA, 16 cores
# and no network: builds remat against that PyTorch (the CUDA build), runs the GPU tests
# (tests/gpu, CTest label gpu), then a benchmark table of training steps on the device, all within
# 8 minutes, and writes everything into one folder.
#
#   bench/gpu_check.sh                 results in $OUT if set, else ./gpu-check-results
#   BUILD_ONLY=1 bench/gpu_check.sh    the build part alone (what a CPU machine can check)
#
# The benchmark (remat bench, bf16 weights and autocast, LoRA rank 16, batch 1, 512 text tokens):
#   flux-small, and a full-width FLUX.1 block stack (FLUX.1-dev's widths: 3072 wide, 24 heads;
#   2 double-stream + 4 single-stream blocks), each at 512x512 and 1024x1024 pixels; per run the
#   layouts off (no checkpointing), 1 (per block), 2 (interval 2), offload (per block, saved inputs
#   in pinned host memory) and auto:BUDGET (the planner's pick under a device-memory budget), each
#   with base_model_precision no_change, int8-quanto and nf4-bnb: step time (median) and peak
#   device memory (the caching allocator's), measured and predicted.
#
# Then `remat plan` on the same block stack (LoRA, int8 base, 512 px) for PLAN_BUDGETS: its
# predicted peak (also with the attention offload forced on), and the measured peak and step time
# of `remat train` with the options it prints
# and with SimpleTuner-style settings (per-block checkpointing with half the blocks swapped; FFN-only
# checkpointing with the attention offload and its prefetch).
#
# Results: gpu_check.log (everything printed), version.txt (remat --version), ctest_gpu.txt,
# bench-<model>-<px>.{txt,json,csv,svg}, summary.md (one table of every bench run), plans.md and
# plan-*.txt / plan-run-*.log.
#
# env: PYTHON (the interpreter whose torch to build against; default python3), JOBS (default 16),
#      BUILD_DIR (default <source>/build-gpu), STEPS (default 3), AUTO_BUDGET (default 12GiB),
#      PLAN_BUDGETS (default "8GiB 5GiB"), PLAN_DEVICE (default cuda), PLAN_CONFIG (default: the stack)
set -euo pipefail

SOURCE_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RESULTS="${OUT:-$PWD/gpu-check-results}"
BUILD="${BUILD_DIR:-$SOURCE_DIR/build-gpu}"
JOBS="${JOBS:-16}"
STEPS="${STEPS:-3}"
AUTO_BUDGET="${AUTO_BUDGET:-12GiB}"
PYTHON="${PYTHON:-python3}"
mkdir -p "$RESULTS"
exec > >(tee "$RESULTS/gpu_check.log") 2>&1
started=$(date +%s)
elapsed() { echo "$(( $(date +%s) - started )) s"; }

echo "== machine"
date -u
nproc
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
"$PYTHON" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())'

echo "== prerequisites"
# What the build needs besides PyTorch (Debian's -dev packages here): named at once if missing,
# since a machine without a network cannot install them.
missing=()
for header in nlohmann/json.hpp toml++/toml.h unicode/uchar.h jpeglib.h webp/decode.h libexif/exif-data.h png.h \
              sentencepiece_processor.h httplib.h gtest/gtest.h gloo/algorithm.h CLI/CLI.hpp; do
  [[ -f /usr/include/$header || -f /usr/local/include/$header ]] || missing+=("$header")
done
command -v cmake >/dev/null || missing+=(cmake)
command -v nvcc >/dev/null || missing+=("nvcc (the CUDA toolkit, which PyTorch's CMake package needs)")
if ((${#missing[@]})); then
  echo "cannot build: missing ${missing[*]} (scripts/install-deps.sh lists the Debian packages)"
  exit 1
fi
GENERATOR=()
command -v ninja >/dev/null && GENERATOR=(-G Ninja)

echo "== build: the CUDA build against $("$PYTHON" -c 'import torch; print(torch.__file__)')"
PREFIX="$("$PYTHON" -c 'import torch; print(torch.utils.cmake_prefix_path)')"
cmake -S "$SOURCE_DIR" -B "$BUILD" "${GENERATOR[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$PREFIX" \
  -DREMAT_BUILD_TESTS=ON -DREMAT_PYTHON_TORCH="$(command -v "$PYTHON")" > "$RESULTS/cmake.txt"
grep -q '^REMAT_WITH_CUDA:BOOL=ON' "$BUILD/CMakeCache.txt" || { echo "the LibTorch found has no CUDA"; exit 1; }
# Only what the check runs: the CLI and the GPU suite (the whole suite is `make test TORCH=pytorch`).
cmake --build "$BUILD" -j "$JOBS" --target remat_cli gpu_tests
REMAT="$BUILD/apps/remat/remat"
"$REMAT" --version | tee "$RESULTS/version.txt"
echo "build done after $(elapsed)"
if [[ ${BUILD_ONLY:-0} == 1 ]]; then
  echo "== BUILD_ONLY=1: stopping before the GPU tests and the benchmark"
  exit 0
fi

echo "== GPU tests"
(cd "$BUILD" && ctest -L gpu --output-on-failure --timeout 300) | tee "$RESULTS/ctest_gpu.txt" || {
  echo "GPU tests failed (see above); the benchmark runs anyway"; }
echo "GPU tests done after $(elapsed)"

echo "== benchmark"
STACK="$RESULTS/flux1-block-stack.json"
cat > "$STACK" <<'JSON'
{"_class_name": "FluxTransformer2DModel", "patch_size": 1, "in_channels": 64, "out_channels": null,
 "num_layers": 2, "num_single_layers": 4, "attention_head_dim": 128, "num_attention_heads": 24,
 "joint_attention_dim": 4096, "pooled_projection_dim": 768, "guidance_embeds": true,
 "axes_dims_rope": [16, 56, 56]}
JSON
bench() {  # bench <name> <resolution> <model flags...>
  local name=$1 px=$2
  shift 2
  "$REMAT" bench --model_family flux "$@" --resolution "${px}x${px}" --text_tokens 512 --batch 1 \
    --dtype bfloat16 --device cuda --lora_rank 16 --steps "$STEPS" --warmup 1 \
    --base_model_precision no_change,int8-quanto,nf4-bnb --layouts "off,1,2,offload,auto:$AUTO_BUDGET" \
    --json "$RESULTS/bench-$name-$px.json" --csv "$RESULTS/bench-$name-$px.csv" --svg "$RESULTS/bench-$name-$px.svg" \
    | tee "$RESULTS/bench-$name-$px.txt" || echo "bench $name $px failed (see above)"
  echo "bench $name $px done after $(elapsed)"
}
for px in 512 1024; do
  bench flux-small "$px" --model_flavour flux-small
  bench flux1-block-stack "$px" --pretrained_transformer_config "$STACK"
done

echo "== plans: remat plan's choice against a SimpleTuner-style setting at the same budget"
# The full-width block stack, LoRA rank 16 on an int8 base, 512 px (1024 image + 512 text
# tokens), on random weights and demo data of FLUX.1-dev's widths. Per budget: what `remat plan`
# predicts, then `remat train` with the options it prints and with SimpleTuner's usual setting for
# a small card (per-block checkpointing, half the blocks swapped), each measured for STEPS steps.
PLAN_DATA="$RESULTS/plan-data"
"$REMAT" make-demo-data --output "$PLAN_DATA" --samples 4 --size 64 --text_tokens 512 --joint_dim 4096 \
  --pooled_dim 768 > /dev/null
plan_common=(--model_family flux --pretrained_transformer_config "${PLAN_CONFIG:-$STACK}" --pretrained_model_name_or_path random
             --model_type lora --lora_rank 16 --resolution 512 --tokenizer_max_length 512 --train_batch_size 1
             --mixed_precision bf16 --base_model_precision int8-quanto --device "${PLAN_DEVICE:-cuda}")
measured() {  # measured <name> <options...>: "peak | median step" of a short run
  local name=$1
  shift
  # shellcheck disable=SC2068  # the options are separate words
  "$REMAT" train "${plan_common[@]}" --instance_data_dir "$PLAN_DATA" --seed 0 --max_train_steps "$STEPS" \
    --checkpointing_steps 0 --report_every 1 --output_dir "$RESULTS/plan-run-$name" $@ > "$RESULTS/plan-run-$name.log" 2>&1 \
    || { echo "failed (plan-run-$name.log) | "; return; }
  sed -n 's/.*median step \([^,]*\), peak memory \(.*\)$/\2 | \1/p' "$RESULTS/plan-run-$name.log" | tail -1
}
{
  echo "| budget | setting | options | predicted peak | measured peak | median step |"
  echo "| --- | --- | --- | --- | --- | --- |"
  for budget in ${PLAN_BUDGETS:-8GiB 5GiB}; do
    out=$("$REMAT" plan "${plan_common[@]}" --budget "$budget" 2>"$RESULTS/plan-$budget.err") || true
    echo "$out" > "$RESULTS/plan-$budget.txt"
    predicted=$(echo "$out" | sed -n 's/^predicted device peak: \(.*\) of .*/\1/p')
    options=$(echo "$out" | sed -n 's/^options: //p')
    if [[ -z "$options" ]]; then
      echo "| $budget | remat plan | $(tail -1 "$RESULTS/plan-$budget.err") | | | |"
      continue
    fi
    # shellcheck disable=SC2086
    echo "| $budget | remat plan | \`$options\` | $predicted | $(measured "plan-$budget" $options) |"
    st="--gradient_checkpointing_interval=1 --musubi_blocks_to_swap=3"
    # shellcheck disable=SC2086
    echo "| $budget | SimpleTuner-style | \`$st\` | | $(measured "st-$budget" $st) |"
    # The attention offload, as SimpleTuner pairs it (FFN-only checkpointing, prefetch), and the
    # plan with the offload forced on: its prediction against the run.
    at="--gradient_checkpointing_backend=torch-ffn --gradient_checkpointing_offload_attention=true --gradient_checkpointing_offload_prefetch=true"
    # shellcheck disable=SC2086
    echo "| $budget | SimpleTuner-style, attention offload | \`$at\` | | $(measured "st-attn-$budget" $at) |"
    out=$("$REMAT" plan "${plan_common[@]}" --gradient_checkpointing_offload_attention=true --budget "$budget" \
      2>"$RESULTS/plan-attn-$budget.err") || true
    echo "$out" > "$RESULTS/plan-attn-$budget.txt"
    predicted=$(echo "$out" | sed -n 's/^predicted device peak: \(.*\) of .*/\1/p')
    options=$(echo "$out" | sed -n 's/^options: //p')
    if [[ -n "$options" ]]; then
      # shellcheck disable=SC2086
      echo "| $budget | remat plan, attention offload | \`$options\` | $predicted | $(measured "plan-attn-$budget" $options) |"
    fi
  done
} | tee "$RESULTS/plans.md"
echo "plans done after $(elapsed)"

echo "== summary"
{
  echo "| model | pixels | base | layout | step s (median) | peak device MiB | predicted MiB |"
  echo "| --- | --- | --- | --- | --- | --- | --- |"
  for csv in "$RESULTS"/bench-*.csv; do
    [[ -f $csv ]] || continue
    stem=$(basename "$csv" .csv)
    "$PYTHON" - "$csv" "$stem" <<'PY'
import csv, sys
path, stem = sys.argv[1], sys.argv[2]
model, px = stem[len("bench-"):].rsplit("-", 1)
for row in csv.DictReader(open(path)):
    mib = lambda v: f"{float(v) / 1048576:.0f}"
    print(f"| {model} | {px} | {row['base_model_precision']} | {row['layout']} | "
          f"{float(row['median_step_s']):.4f} | {mib(row['peak_bytes'])} | {mib(row['predicted_peak_bytes'])} |")
PY
  done
} | tee "$RESULTS/summary.md"
echo "== done after $(elapsed): results in $RESULTS"
