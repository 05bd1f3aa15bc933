#!/usr/bin/env bash
# examples/simpletuner-kontext (SimpleTuner's kontext.peft-lora config.json, its data pointed at a
# pair of demo folders as FLUX_KONTEXT.md lays pairs out) trains FLUX.1 Kontext with remat: run from
# a scratch directory holding two demo picture sets with the same file names (the edits, and the
# references with another seed) and a tiny pipeline folder whose model_index.json names
# FluxKontextPipeline, for 2 steps. It must exit 0, pair every picture, cache the references in their
# own folder, render the edits at validation, reuse the caches on a second run, and `remat sample
# --image` must render an edit with the trained LoRA.
# Usage: kontext_example_test.sh <remat binary> <repository root>
set -u
remat=$1
root=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; echo "$out" | head -40; exit 1; }

mkdir -p "$work/examples"
cp -r "$root/examples/simpletuner-kontext" "$work/examples/"
cd "$work" || exit 1
out=$("$remat" make-demo-images --output out/demo-edits --count 6 --size 32 2>&1) || fail "make-demo-images (edits)"
out=$("$remat" make-demo-images --output out/demo-references --count 6 --size 32 --seed 1 2>&1) \
  || fail "make-demo-images (references)"
out=$("$remat" make-demo-pipeline --output out/demo-kontext --dtype fp32 2>&1) || fail "make-demo-pipeline"
sed -i 's/"FluxPipeline"/"FluxKontextPipeline"/' out/demo-kontext/model_index.json
grep -q FluxKontextPipeline out/demo-kontext/model_index.json || fail "model_index.json was not rewritten"

# The config names no model (SimpleTuner loads the flavour's hub id): the flag points at the tiny
# pipeline, and the validation flags shrink the config's 512x512, 25-step pictures.
args=(--config examples/simpletuner-kontext/config.json --pretrained_model_name_or_path=out/demo-kontext
      --max_train_steps=2 --torch_num_threads=1 --validation_resolution=32 --validation_num_inference_steps=2)
out=$("$remat" train "${args[@]}" 2>&1)
status=$?
[[ $status -eq 0 ]] || fail "exit $status (want 0)"
grep -q '^summary: 2 steps' <<<"$out" || fail "no 'summary: 2 steps'"
grep -q "dataset 'edited-images' (out/demo-edits): 6 picture pair(s) paired with 'reference-images'" <<<"$out" \
  || fail "the pairs are not reported"
grep -q 'VAE latents: 12 encoded' <<<"$out" || fail "want 6 edits and 6 references encoded"
ls out/examples/simpletuner-kontext/cache/vae/reference-images/image_0000.png.safetensors > /dev/null 2>&1 \
  || fail "no reference latents in the reference dataset's cache_dir_vae"
gallery=out/examples/simpletuner-kontext/validation_images
for n in 0 1 2 3; do  # num_eval_images 4
  ls "$gallery/step_0_edited-images_${n}_0_32x32.png" > /dev/null 2>&1 || fail "no step-0 validation edit $n"
done
grep -q 'edited-images_0' "$gallery/index.html" || fail "the gallery has no edit column"

out=$("$remat" train "${args[@]}" --output_dir=out/examples/second --validation_disable 2>&1) || fail "second run"
grep -q 'VAE latents: 0 encoded' <<<"$out" || fail "the second run encoded latents again"

out=$("$remat" sample --pipeline out/demo-kontext --image out/demo-references/image_0000.png --prompt "a red circle" \
      --lora out/examples/simpletuner-kontext/pytorch_lora_weights.safetensors --width 32 --height 32 \
      --max_area 1024 --image_auto_resize false --num_inference_steps 2 --dtype float32 --output edit.png 2>&1) \
  || fail "remat sample --image with the LoRA"
[[ -s edit.png ]] || fail "no edit.png"
echo "ok: examples/simpletuner-kontext trains FLUX.1 Kontext with remat (2 steps), caches reused, sample --image renders"
