#!/usr/bin/env bash
# examples/simpletuner-flux (SimpleTuner's flux.peft-lora config.json and its multidatabackend.json
# example, pointed at the demo's pictures and pipeline folder) trains with remat as it is: run from
# a scratch directory holding what `make demo` generates (out/demo-images, out/demo-pipeline), for
# 2 steps. It must exit 0, print the one warning about SimpleTuner options remat does not
# implement and the one about multidatabackend keys it ignores, cache every picture and train.
# Usage: simpletuner_example_test.sh <remat binary> <repository root>
set -u
remat=$1
root=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; echo "$out" | head -40; exit 1; }

mkdir -p "$work/examples"
cp -r "$root/examples/simpletuner-flux" "$work/examples/"
cd "$work" || exit 1
out=$("$remat" make-demo-images --output out/demo-images --count 12 --size 32 2>&1) || fail "make-demo-images"
out=$("$remat" make-demo-pipeline --output out/demo-pipeline --transformer_preset flux-small --dtype fp32 2>&1) \
  || fail "make-demo-pipeline"

# The config's validation images (1024x1024, 16 steps) would take minutes on a CPU: the flags
# shrink them as --max_train_steps shrinks the run; the step-0 pictures and gallery must appear.
out=$("$remat" train --config examples/simpletuner-flux/config.json --max_train_steps=2 --torch_num_threads=1 \
  --validation_resolution=32 --validation_num_inference_steps=2 2>&1)
status=$?
[[ $status -eq 0 ]] || fail "exit $status (want 0)"
grep -q '^summary: 2 steps' <<<"$out" || fail "no 'summary: 2 steps'"
[[ $(grep -c 'SimpleTuner options\? that remat does not implement' <<<"$out") -eq 1 ]] \
  || fail "want exactly one grouped warning about SimpleTuner options"
grep -q "multidatabackend.json: keys remat does not implement are ignored: backend 'something-special-to-remember-by': .*vae_cache_clear_each_epoch" <<<"$out" \
  || fail "want the warning naming the multidatabackend keys remat ignores"
grep -q "another-special-name-for-another-backend" <<<"$out" && fail "the disabled aws backend must be skipped silently"
ls out/examples/simpletuner-flux/cache/vae/*.safetensors > /dev/null 2>&1 || fail "no latents in the backend's cache_dir_vae"
ls out/examples/simpletuner-flux/cache/text/*.safetensors > /dev/null 2>&1 || fail "no text embeddings in alt-embed-cache's cache_dir"
ls out/examples/simpletuner-flux/validation_images/step_0_validation_0_32x32.png > /dev/null 2>&1 \
  || fail "no step-0 validation picture"
grep -q 'step_0_validation_0_32x32.png' out/examples/simpletuner-flux/validation_images/index.html \
  || fail "the gallery does not show the step-0 picture"

# A second run reuses every cache entry.
out=$("$remat" train --config examples/simpletuner-flux/config.json --max_train_steps=2 --torch_num_threads=1 \
      --output_dir=out/examples/second --validation_disable 2>&1) || fail "second run"
grep -q 'VAE latents: 0 encoded' <<<"$out" || fail "the second run encoded latents again"
echo "ok: examples/simpletuner-flux trains with remat (2 steps), caches reused on the second run"
