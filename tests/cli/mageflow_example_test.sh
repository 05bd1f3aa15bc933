#!/usr/bin/env bash
# SimpleTuner's five MageFlow LoRA example configs (examples/mageflow-image-*.peft-lora) run with
# remat from a scratch directory holding demo pictures with captions and a tiny MageFlow pipeline
# folder: flags point each at the folder, the small mageflow-tiny flavour and small data, for 2
# steps. Each must train, or stop only on options listed as not implemented (and then train with
# --ignore_unsupported_options). One run renders validation pictures into the gallery, a second
# reuses the caches, `remat sample` renders with the trained LoRA, and the bad inputs (a Flux folder
# given as MageFlow, a missing component) are clear errors.
# Usage: mageflow_example_test.sh <remat binary> <repository root>
set -u
remat=$1
root=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; echo "$out" | head -40; exit 1; }

mkdir -p "$work/examples"
cp -r "$root"/examples/mageflow-image* "$work/examples/"
cd "$work" || exit 1
out=$("$remat" make-demo-images --output out/demo --count 6 --size 64 2>&1) || fail "make-demo-images"
out=$("$remat" make-demo-pipeline --model_family mageflow --output out/demo-mageflow --dtype fp32 2>&1) \
  || fail "make-demo-pipeline --model_family mageflow"
grep -q '"_class_name": "MageFlowPipeline"' out/demo-mageflow/model_index.json || fail "no MageFlowPipeline folder"

# The examples' own data configs crop to 512-1024 px; this one keeps the demo pictures small.
cat > small-data.json <<'JSON'
[
  {"id": "pictures", "type": "local", "instance_data_dir": "out/demo", "caption_strategy": "textfile",
   "resolution": 64, "resolution_type": "pixel", "crop": true, "crop_aspect": "square",
   "cache_dir_vae": "out/cache/vae"},
  {"id": "text-embeds", "type": "local", "dataset_type": "text_embeds", "default": true, "cache_dir": "out/cache/text"}
]
JSON

# What a build without float8 dtypes refuses in these configs: fp8wo-torchao base weights.
if "$remat" --version | grep -q '^float8 base weights: yes'; then refused=""; else refused="base_model_precision"; fi

flags=(--pretrained_model_name_or_path=out/demo-mageflow --model_flavour=mageflow-tiny
       --data_backend_config=small-data.json --max_train_steps=2 --torch_num_threads=1)
for size in 12 24 32 48 80; do
  config=examples/mageflow-image-${size}g.peft-lora/config.json
  out=$("$remat" train --config "$config" "${flags[@]}" 2>&1)
  status=$?
  if [[ $status -eq 2 && -n "$refused" ]]; then
    grep -q "unsupported.*$refused\|$refused.*unsupported\|$refused.*not implemented" <<<"$out" || fail "$config: exit 2 without naming $refused"
    errors=$(grep '^remat train: error:' <<<"$out" | grep -v "$refused")
    [[ -z "$errors" ]] || fail "$config: other errors: $errors"
    out=$("$remat" train --config "$config" "${flags[@]}" --ignore_unsupported_options 2>&1)
    status=$?
  fi
  [[ $status -eq 0 ]] || fail "$config: exit $status (want 0)"
  grep -q '^summary: 2 steps' <<<"$out" || fail "$config: no 'summary: 2 steps'"
  echo "ok: $config trains (refused first: ${refused:-nothing})"
done

# Validation pictures in the gallery, the caches written by the first runs reused.
args=(--config examples/mageflow-image-80g.peft-lora/config.json "${flags[@]}" --ignore_unsupported_options
      --base_model_precision=no_change --output_dir=out/validated --validation_step_interval=2
      --validation_prompt="a red square" --validation_resolution=32 --validation_num_inference_steps=2
      --validation_guidance=3 --validation_negative_prompt="blurry")
out=$("$remat" train "${args[@]}" 2>&1) || fail "the validated run"
grep -q 'VAE latents: 0 encoded' <<<"$out" || fail "the validated run encoded latents again"
grep -q 'text embeddings: 0 encoded' <<<"$out" || fail "the validated run encoded captions again"
gallery=out/validated/validation_images
ls "$gallery"/step_2_*_32x32.png > /dev/null 2>&1 || fail "no step-2 validation picture in $gallery"
grep -q 'step_2_' "$gallery/index.html" || fail "the gallery does not show step 2"
[[ -s out/validated/pytorch_lora_weights.safetensors ]] || fail "no LoRA written"

out=$("$remat" sample --pipeline out/demo-mageflow --prompt "a red square" --negative_prompt "blurry" \
      --lora out/validated/pytorch_lora_weights.safetensors --width 32 --height 48 --num_inference_steps 2 \
      --dtype float32 --output picture.png 2>&1) || fail "remat sample with the LoRA"
[[ -s picture.png ]] || fail "no picture.png"

# Bad inputs: a Flux folder given as MageFlow, a MageFlow folder without its VAE.
out=$("$remat" make-demo-pipeline --output out/demo-flux --dtype fp32 2>&1) || fail "make-demo-pipeline (flux)"
out=$("$remat" train --config examples/mageflow-image-80g.peft-lora/config.json "${flags[@]}" \
      --pretrained_model_name_or_path=out/demo-flux --ignore_unsupported_options 2>&1)
[[ $? -eq 2 ]] || fail "a Flux folder trained as MageFlow"
grep -q 'MageFlowPipeline' <<<"$out" || fail "the Flux-folder error does not say what was expected"
# An edit flavour trains from text alone: reference pictures are refused, naming why.
cat > pairs-data.json <<'JSON'
[
  {"id": "edits", "type": "local", "instance_data_dir": "out/demo", "caption_strategy": "textfile", "resolution": 64,
   "resolution_type": "pixel", "conditioning_data": ["references"], "cache_dir_vae": "out/cache/edits"},
  {"id": "references", "type": "local", "instance_data_dir": "out/demo", "conditioning_type": "reference_strict",
   "resolution": 64, "resolution_type": "pixel", "cache_dir_vae": "out/cache/references"},
  {"id": "text-embeds", "type": "local", "dataset_type": "text_embeds", "default": true, "cache_dir": "out/cache/text"}
]
JSON
out=$("$remat" train --config examples/mageflow-image-80g.peft-lora/config.json "${flags[@]}" --model_flavour=edit \
      --data_backend_config=pairs-data.json --ignore_unsupported_options 2>&1)
[[ $? -eq 2 ]] || fail "an edit flavour trained on reference pictures"
grep -q "vision tower" <<<"$out" || fail "the reference-picture error does not say why"
rm -r out/demo-mageflow/vae
out=$("$remat" sample --pipeline out/demo-mageflow --prompt "x" --width 32 --height 32 --output x.png 2>&1)
[[ $? -ne 0 ]] || fail "sampling without vae/ succeeded"
grep -q "vae" <<<"$out" || fail "the missing-VAE error does not name it"
[[ ! -e x.png ]] || fail "a picture was written without a VAE"
echo "ok: the MageFlow examples train with remat, validation renders, caches are reused, sample renders with the LoRA"
