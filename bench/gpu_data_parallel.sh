#!/usr/bin/env bash
# Data-parallel training on a multi-GPU machine with a CUDA PyTorch 2.x (prepared; not run in the
# CPU-only task that wrote it). Builds bench_data_parallel against that PyTorch's LibTorch with
# every core, then runs it with --device cuda: each run sets 1 GPU against P GPUs (P = 2 and the
# machine's GPU count), each rank on cuda:LOCAL_RANK with NCCL, LoRA and full fine-tune of a
# Flux-shaped model in bf16 at 1024x1024 (4096 image + 512 text tokens), per-rank batch 1.
#
# usage: bench/gpu_data_parallel.sh     (results under $OUT if set, else ./gpu-data-parallel-results)
# env:   BLOCKS_DOUBLE / BLOCKS_SINGLE  block counts of the Flux-shaped config (default 4 / 8: flux-dev's
#        widths, fewer blocks, so a full fine-tune with AdamW fits a 40 GB GPU; 19 / 38 is flux-dev)
#        LORA_RANK (16), BATCH (1), STEPS (10), WARMUP (3), CHECKPOINT (off | N), MODES (lora,full),
#        JOBS (nproc), BUILD_DIR (build-gpu), PYTHON (python3)
set -euo pipefail

SOURCE_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RESULTS="${OUT:-$PWD/gpu-data-parallel-results}"
BUILD="${BUILD_DIR:-$SOURCE_DIR/build-gpu}"
JOBS="${JOBS:-$(nproc)}"
BLOCKS_DOUBLE="${BLOCKS_DOUBLE:-4}"
BLOCKS_SINGLE="${BLOCKS_SINGLE:-8}"
LORA_RANK="${LORA_RANK:-16}"
BATCH="${BATCH:-1}"
STEPS="${STEPS:-10}"
WARMUP="${WARMUP:-3}"
CHECKPOINT="${CHECKPOINT:-off}"
MODES="${MODES:-lora,full}"
PYTHON="${PYTHON:-python3}"
mkdir -p "$RESULTS"
exec > >(tee "$RESULTS/gpu_data_parallel.log") 2>&1

echo "== machine"
date -u
nvidia-smi
nvidia-smi topo -m || true
"$PYTHON" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version())'
GPUS="$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)"
echo "GPUs: $GPUS"
if [ "$GPUS" -lt 2 ]; then
  echo "data parallelism needs at least 2 GPUs; this machine has $GPUS"
  exit 1
fi

echo "== build bench_data_parallel (PyTorch's LibTorch, CUDA parts and NCCL on, $JOBS jobs)"
PREFIX="$("$PYTHON" -c 'import torch; print(torch.utils.cmake_prefix_path)')"
cmake -S "$SOURCE_DIR" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$PREFIX" \
  -DREMAT_WITH_CUDA=ON -DREMAT_BUILD_BENCHMARKS=ON -DREMAT_BUILD_TESTS=OFF
cmake --build "$BUILD" -j "$JOBS" --target bench_data_parallel

echo "== Flux-shaped config: flux-dev widths, $BLOCKS_DOUBLE double + $BLOCKS_SINGLE single blocks"
CONFIG="$RESULTS/flux-data-parallel.json"
cat > "$CONFIG" <<JSON
{"_class_name": "FluxTransformer2DModel", "patch_size": 1, "in_channels": 64, "out_channels": null,
 "num_layers": $BLOCKS_DOUBLE, "num_single_layers": $BLOCKS_SINGLE, "attention_head_dim": 128,
 "num_attention_heads": 24, "joint_attention_dim": 4096, "pooled_projection_dim": 768,
 "guidance_embeds": true, "axes_dims_rope": [16, 56, 56]}
JSON

BENCH="$BUILD/bench/bench_data_parallel"
# Each process gets nproc / P CPU threads (the driver divides --cores among a run's processes).
for P in $(printf '%s\n' 2 "$GPUS" | sort -nu); do
  echo "== 1 GPU against $P GPUs (NCCL)"
  "$BENCH" --device cuda --config "$CONFIG" --dtype bfloat16 --modes "$MODES" --lora_rank "$LORA_RANK" \
    --batch "$BATCH" --image_tokens 4096 --text_tokens 512 --steps "$STEPS" --warmup "$WARMUP" \
    --checkpoint "$CHECKPOINT" --processes "$P" --cores "$(nproc)" --timeout 600 \
    --json "$RESULTS/data_parallel_${P}gpu.json" | tee "$RESULTS/data_parallel_${P}gpu.txt"
done

echo "== done: results in $RESULTS"
