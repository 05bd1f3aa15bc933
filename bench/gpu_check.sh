#!/usr/bin/env bash
# One prepared GPU check for a machine with a CUDA PyTorch 2.x (not run in the CPU-only task that
# wrote it). Builds remat against that PyTorch, runs the gpu-labelled tests (if any), then
# `remat bench` on a Flux-shaped model in bf16 at 1024x1024 (4096 image + 512 text tokens,
# batch 1) for off,1,2,4,offload and an auto budget, and the PyTorch-eager comparison.
#
# usage: bench/gpu_check.sh            (results under $OUT if set, else ./gpu-check-results)
# env:   BLOCKS_DOUBLE / BLOCKS_SINGLE  block counts of the Flux-shaped config (default 4 / 8:
#        flux-dev's width, fewer blocks so it fits any 24 GB+ GPU; 19 / 38 is flux-dev itself)
#        LORA_RANK (default 16; 0 = full fine-tune), STEPS (default 5), JOBS (default 16)
#        AUTO_BUDGET (default 20GiB)
set -euo pipefail

SOURCE_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RESULTS="${OUT:-$PWD/gpu-check-results}"
BUILD="${BUILD_DIR:-$SOURCE_DIR/build-gpu}"
JOBS="${JOBS:-16}"
BLOCKS_DOUBLE="${BLOCKS_DOUBLE:-4}"
BLOCKS_SINGLE="${BLOCKS_SINGLE:-8}"
LORA_RANK="${LORA_RANK:-16}"
STEPS="${STEPS:-5}"
AUTO_BUDGET="${AUTO_BUDGET:-20GiB}"
PYTHON="${PYTHON:-python3}"
mkdir -p "$RESULTS"
exec > >(tee "$RESULTS/gpu_check.log") 2>&1

echo "== machine"
date -u
nvidia-smi || true
"$PYTHON" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))'

echo "== build (PyTorch's LibTorch, CUDA parts on)"
PREFIX="$("$PYTHON" -c 'import torch; print(torch.utils.cmake_prefix_path)')"
cmake -S "$SOURCE_DIR" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$PREFIX" \
  -DREMAT_WITH_CUDA=ON -DREMAT_BUILD_BENCHMARKS=ON -DREMAT_BUILD_TESTS=ON
cmake --build "$BUILD" -j "$JOBS"

echo "== gpu-labelled tests"
(cd "$BUILD" && ctest -L gpu --output-on-failure) | tee "$RESULTS/ctest_gpu.txt" || {
  echo "gpu tests failed (see above)"; exit 1; }

echo "== Flux-shaped config: flux-dev widths, $BLOCKS_DOUBLE double + $BLOCKS_SINGLE single blocks"
CONFIG="$RESULTS/flux-gpu-check.json"
cat > "$CONFIG" <<JSON
{"_class_name": "FluxTransformer2DModel", "patch_size": 1, "in_channels": 64, "out_channels": null,
 "num_layers": $BLOCKS_DOUBLE, "num_single_layers": $BLOCKS_SINGLE, "attention_head_dim": 128,
 "num_attention_heads": 24, "joint_attention_dim": 4096, "pooled_projection_dim": 768,
 "guidance_embeds": true, "axes_dims_rope": [16, 56, 56]}
JSON

REMAT="$BUILD/apps/remat/remat"
COMMON=(--model_family flux --pretrained_transformer_config "$CONFIG" --resolution 1024x1024 --text_tokens 512 --batch 1
        --dtype bfloat16 --lora_rank "$LORA_RANK" --steps "$STEPS" --warmup 1)

echo "== remat bench (cuda, bf16, 1024x1024)"
"$REMAT" bench "${COMMON[@]}" --device cuda --layouts "off,1,2,4,offload,auto:$AUTO_BUDGET" \
  --json "$RESULTS/remat_bench.json" --csv "$RESULTS/remat_bench.csv" --svg "$RESULTS/remat_bench.svg" \
  | tee "$RESULTS/remat_bench.txt"

echo "== PyTorch eager comparison"
# bench/flux_eager.py measures on CPU only today (tracked CPU allocator); comparing it with a CUDA
# remat run would compare devices, not implementations. Run it only once it has a --device flag.
if "$PYTHON" "$SOURCE_DIR/bench/flux_eager.py" bench --help | grep -q -- "--device"; then
  "$PYTHON" "$SOURCE_DIR/bench/compare_pytorch.py" --remat "$REMAT" --config "$CONFIG" \
    --image_tokens 4096 --text_tokens 512 --batch 1 --dtype bfloat16 --lora_rank "$LORA_RANK" \
    --layouts off,1,2,4 --steps "$STEPS" --warmup 1 --rounds 2 --remat-arg=--device --remat-arg=cuda \
    --markdown "$RESULTS/compare_pytorch.md" --json "$RESULTS/compare_pytorch.json" \
    | tee "$RESULTS/compare_pytorch.txt" || echo "comparison failed (see above); remat results are in $RESULTS"
else
  echo "skipped: bench/flux_eager.py has no --device flag yet (CPU only); remat results are in $RESULTS"
fi

echo "== done: results in $RESULTS"
