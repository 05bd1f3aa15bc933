#!/usr/bin/env bash
# Parity of remat's C++ Flux model with the independent PyTorch-eager implementation
# (bench/flux_eager.py), float32, on a tiny guidance-distilled config:
#   1. weights from `remat init`, inputs from `flux_eager.py make-inputs`;
#   2. weights from `flux_eager.py init` (RMSNorm weights != 1, written by another writer);
# each run through `remat forward` and `flux_eager.py forward`; `sample` must agree to
# allclose(rtol 1e-4, atol 1e-5). The image grid is 4 x 6 (not square) and the batch is 2, so a
# transposed id table or a batch mix-up shows.
#
# usage: flux_parity_test.sh <remat binary> <source dir>
set -euo pipefail

if [[ $# -ne 2 ]]; then
  echo "usage: $0 <remat binary> <source dir>" >&2
  exit 2
fi
REMAT=$1
SOURCE_DIR=$2
PYTHON=/usr/bin/python3  # Debian's interpreter, the one with python3-torch
EAGER="$SOURCE_DIR/bench/flux_eager.py"

if [[ ! -x "$REMAT" ]]; then
  echo "error: remat binary must be an executable file, got '$REMAT'" >&2
  exit 1
fi
if [[ ! -f "$EAGER" ]]; then
  echo "error: source dir must contain bench/flux_eager.py, got '$SOURCE_DIR'" >&2
  exit 1
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/flux-parity.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

cat > "$WORK/config.json" <<'JSON'
{
  "_class_name": "FluxTransformer2DModel",
  "patch_size": 1,
  "in_channels": 64,
  "out_channels": null,
  "num_layers": 2,
  "num_single_layers": 3,
  "attention_head_dim": 32,
  "num_attention_heads": 4,
  "joint_attention_dim": 96,
  "pooled_projection_dim": 48,
  "guidance_embeds": true,
  "axes_dims_rope": [8, 12, 12]
}
JSON

run() {
  echo "+ $*"
  "$@"
}

run "$PYTHON" "$EAGER" make-inputs --config "$WORK/config.json" --image_tokens 24 --text_tokens 8 \
  --batch 2 --seed 7 --output "$WORK/inputs.safetensors"
run "$REMAT" init --model_family flux --pretrained_transformer_config "$WORK/config.json" --seed 1 --output "$WORK/remat_weights.safetensors"
run "$PYTHON" "$EAGER" init --config "$WORK/config.json" --seed 2 --output "$WORK/py_weights.safetensors"

status=0
for weights in remat_weights py_weights; do
  run "$REMAT" forward --model_family flux --pretrained_transformer_config "$WORK/config.json" --weights "$WORK/$weights.safetensors" \
    --inputs "$WORK/inputs.safetensors" --output "$WORK/cpp_$weights.safetensors"
  run "$PYTHON" "$EAGER" forward --config "$WORK/config.json" --weights "$WORK/$weights.safetensors" \
    --inputs "$WORK/inputs.safetensors" --output "$WORK/py_$weights.safetensors" --threads 1
  "$PYTHON" - "$SOURCE_DIR/bench" "$WORK/cpp_$weights.safetensors" "$WORK/py_$weights.safetensors" "$weights" <<'PY' || status=1
import sys
sys.path.insert(0, sys.argv[1])
import torch
import safetensors_lite

cpp, _ = safetensors_lite.load_file(sys.argv[2])
ref, _ = safetensors_lite.load_file(sys.argv[3])
label = sys.argv[4]
if "sample" not in cpp:
    sys.exit(f"FAIL [{label}]: remat forward output must contain 'sample', got {sorted(cpp)}")
got, want = cpp["sample"], ref["sample"]
if tuple(got.shape) != tuple(want.shape):
    sys.exit(f"FAIL [{label}]: sample shape must be {tuple(want.shape)}, got {tuple(got.shape)}")
if got.dtype != torch.float32:
    sys.exit(f"FAIL [{label}]: sample dtype must be float32, got {got.dtype}")
diff = (got - want).abs()
close = torch.allclose(got, want, rtol=1e-4, atol=1e-5)
print(f"[{label}] sample {tuple(got.shape)}: max abs diff {diff.max().item():.3e}, "
      f"max |reference| {want.abs().max().item():.3e}, allclose(rtol=1e-4, atol=1e-5) = {close}")
if not torch.isfinite(want).all() or want.abs().max() == 0:
    sys.exit(f"FAIL [{label}]: the reference output is degenerate (non-finite or all zero)")
if not close:
    worst = int(diff.argmax())
    sys.exit(f"FAIL [{label}]: worst element flat index {worst}: remat {got.flatten()[worst].item():.6e}, "
             f"PyTorch {want.flatten()[worst].item():.6e}")
PY
done

if [[ $status -ne 0 ]]; then
  echo "flux parity: FAILED"
  exit 1
fi
echo "flux parity: OK"
