#!/usr/bin/env bash
# Models named by Hugging Face id, found in a hub cache built here in huggingface_hub's layout
# (models--org--name/refs/<name> -> snapshots/<commit>/, every file a symlink into blobs/) from
# the tiny demo pipeline, with two revisions:
# - SimpleTuner's flux.peft-lora example config as SimpleTuner ships it (no model_flavour, no
#   pretrained_model_name_or_path: the flavour's hub id, black-forest-labs/flux.1-krea-dev, stored
#   under another case as `hf download black-forest-labs/FLUX.1-Krea-dev` stores it) trains, with
#   only data, step and validation-size overrides;
# - --revision (a tag, a commit hash) selects the other snapshot;
# - each missing piece (repository, revision, component, blob) exits 2 naming the id, the revision,
#   the paths looked at and the `hf download` command;
# - `remat sample --pipeline org/name` samples from the cache, `--lora org/name` merges a LoRA from it.
# Usage: hub_cache_test.sh <remat binary> <repository root>
set -u
remat=$1
root=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/expect.sh"
cd "$work" || exit 1

"$remat" make-demo-images --output out/demo-images --count 12 --size 32 > /dev/null || { echo "FAIL: images"; exit 1; }
"$remat" make-demo-pipeline --output pipe-a --transformer_preset flux-tiny --dtype fp32 > /dev/null \
  || { echo "FAIL: pipeline a"; exit 1; }
"$remat" make-demo-pipeline --output pipe-b --transformer_preset flux-tiny --dtype fp32 --seed 7 > /dev/null \
  || { echo "FAIL: pipeline b"; exit 1; }
cmp -s pipe-a/transformer/diffusion_pytorch_model.safetensors pipe-b/transformer/diffusion_pytorch_model.safetensors \
  && { echo "FAIL: the two revisions' transformers must differ"; exit 1; }

export HF_HUB_CACHE=$work/hub
repo=$HF_HUB_CACHE/models--black-forest-labs--FLUX.1-Krea-dev
commit_a=1111111111111111111111111111111111111111
commit_b=2222222222222222222222222222222222222222
# snapshot <commit> <source folder>: every file a blob named by its hash, linked relatively.
snapshot() {
  local commit=$1 source=$2 file hash link
  while IFS= read -r file; do
    hash=$(sha256sum "$source/$file" | cut -d' ' -f1)
    mkdir -p "$repo/blobs"
    cp "$source/$file" "$repo/blobs/$hash"
    link=$repo/snapshots/$commit/$file
    mkdir -p "$(dirname "$link")"
    ln -s "$(realpath --relative-to="$(dirname "$link")" "$repo/blobs/$hash")" "$link"
  done < <(cd "$source" && find . -type f | sed 's|^\./||')
}
snapshot $commit_a pipe-a
snapshot $commit_b pipe-b
mkdir -p "$repo/refs"
printf %s $commit_a > "$repo/refs/main"
printf %s $commit_b > "$repo/refs/v2"
[[ -L "$repo/snapshots/$commit_a/transformer/config.json" ]] || { echo "FAIL: the snapshot is not symlinks"; exit 1; }

# SimpleTuner's example as it ships: without the two keys examples/simpletuner-flux sets.
mkdir -p examples
cp -r "$root/examples/simpletuner-flux" examples/
python3 - <<'EOF' || { echo "FAIL: writing the config"; exit 1; }
import json
path = "examples/simpletuner-flux/config.json"
config = json.load(open(path))
for key in ("model_flavour", "pretrained_model_name_or_path"):
    del config[key]
json.dump(config, open("simpletuner-flux.json", "w"), indent=4)
EOF
small=(--max_train_steps=2 --torch_num_threads=1 --validation_resolution=32 --validation_num_inference_steps=2)
out=$("$remat" train --config simpletuner-flux.json "${small[@]}" 2>&1)
status=$?
if [[ $status -ne 0 ]]; then
  fail "SimpleTuner's example exited $status (want 0)"
  echo "$out" | tail -5
else
  grep -q "pretrained_model_name_or_path: black-forest-labs/flux.1-krea-dev at revision main (commit $commit_a) from the Hugging Face cache: $repo/snapshots/$commit_a" <<<"$out" \
    || fail "the run does not print the id, revision, commit and snapshot it resolved"
  grep -q "transformer: $repo/snapshots/$commit_a/transformer" <<<"$out" || fail "not the main snapshot's transformer"
  grep -q '^summary: 2 steps' <<<"$out" || fail "no 'summary: 2 steps'"
  grep -q 'random' <<<"$out" && fail "a run with a model found in the cache must not mention random weights"
  ls out/examples/simpletuner-flux/validation_images/step_0_validation_0_32x32.png > /dev/null 2>&1 \
    || fail "no validation picture from the cached pipeline's encoders and VAE"
  echo "ok: SimpleTuner's flux.peft-lora example trains from the hub cache"
fi

# The other snapshot, by tag and by commit; an explicit id in any case.
base=(train --model_family flux --model_type lora --instance_data_dir out/demo-images --resolution 32
      --max_train_steps 1 --torch_num_threads 1 --validation_disable --output_dir out/revision)
expect 0 "transformer: $repo/snapshots/$commit_b/transformer" -- "$remat" "${base[@]}" --revision v2
expect 0 "at revision $commit_b (commit $commit_b)" -- "$remat" "${base[@]}" --revision $commit_b
expect 0 "transformer: $repo/snapshots/$commit_a/transformer" -- \
  "$remat" "${base[@]}" --pretrained_model_name_or_path BLACK-FOREST-LABS/flux.1-KREA-dev

# Each missing piece: exit 2, the id, the revision, where it looked, the command that fetches it.
expect 2 "black-forest-labs/flux.1-dev (revision main) is not in the Hugging Face cache $HF_HUB_CACHE (chosen by HF_HUB_CACHE" -- \
  "$remat" "${base[@]}" --model_flavour dev
expect 2 "looked for $HF_HUB_CACHE/models--black-forest-labs--flux.1-dev (any case); remat does not download: fetch it with \`hf download black-forest-labs/flux.1-dev --revision main\`" -- \
  "$remat" "${base[@]}" --model_flavour dev
expect 2 "or pretrained_model_name_or_path=random to start from random weights" -- "$remat" "${base[@]}" --model_flavour dev
expect 2 "has no revision v3 in the Hugging Face cache $HF_HUB_CACHE" -- "$remat" "${base[@]}" --revision v3
expect 2 "looked at $repo/refs/v3; remat does not download: fetch it with \`hf download black-forest-labs/flux.1-krea-dev --revision v3\`" -- \
  "$remat" "${base[@]}" --revision v3
mv "$repo/snapshots/$commit_b/transformer" transformer-b
expect 2 "component 'transformer' needs the directory '$repo/snapshots/$commit_b/transformer'" -- \
  "$remat" "${base[@]}" --revision v2
expect 2 "fetch the missing files with \`hf download black-forest-labs/flux.1-krea-dev --revision v2\`" -- \
  "$remat" "${base[@]}" --revision v2
mv transformer-b "$repo/snapshots/$commit_b/transformer"
# A blob gone (a pruned or interrupted download) leaves a dangling link: the file is missing.
blob=$(readlink -f "$repo/snapshots/$commit_b/model_index.json")
mv "$blob" blob-aside
expect 2 "black-forest-labs/FLUX.1-Krea-dev at revision v2 (commit $commit_b, snapshot $repo/snapshots/$commit_b) lacks model_index.json" -- \
  "$remat" sample --pipeline black-forest-labs/FLUX.1-Krea-dev --revision v2 --prompt "a red square" --output s.png
mv blob-aside "$blob"
# remat sample from the cache, both revisions.
for revision in main v2; do
  expect 0 "pipeline: black-forest-labs/FLUX.1-Krea-dev at revision $revision" -- \
    "$remat" sample --pipeline black-forest-labs/FLUX.1-Krea-dev --revision $revision --prompt "a red square" \
      --width 32 --height 32 --num_inference_steps 2 --dtype float32 --output "s-$revision.png" --torch_num_threads 1
done
cmp -s s-main.png s-v2.png && fail "the two revisions sampled the same picture"
# A variant the snapshot does not have: the error names the variant's files and what is there.
expect 2 "the 'fp16' variant (diffusers' and transformers' names: diffusion_pytorch_model.fp16.safetensors" -- \
  "$remat" sample --pipeline black-forest-labs/FLUX.1-Krea-dev --variant fp16 --prompt "a red square" \
    --width 32 --height 32 --num_inference_steps 2 --output s-x.png
expect 2 "fetch the missing files with \`hf download black-forest-labs/flux.1-krea-dev --revision main\`" -- \
  "$remat" "${base[@]}" --variant fp16

# A LoRA by hub id: the repository's pytorch_lora_weights.safetensors (diffusers' default name); a
# repository with several candidate files is refused, naming them.
lora_repo=$HF_HUB_CACHE/models--someone--my-flux-lora
lora_commit=3333333333333333333333333333333333333333
mkdir -p "$lora_repo/snapshots/$lora_commit" "$lora_repo/refs" "$lora_repo/blobs"
hash=$(sha256sum out/examples/simpletuner-flux/pytorch_lora_weights.safetensors | cut -d' ' -f1)
cp out/examples/simpletuner-flux/pytorch_lora_weights.safetensors "$lora_repo/blobs/$hash"
ln -s "../../blobs/$hash" "$lora_repo/snapshots/$lora_commit/pytorch_lora_weights.safetensors"
printf %s $lora_commit > "$lora_repo/refs/main"
expect 0 "LoRA: someone/my-flux-lora at revision main (commit $lora_commit) from the Hugging Face cache" -- \
  "$remat" sample --pipeline black-forest-labs/FLUX.1-Krea-dev --lora someone/my-flux-lora:2 --prompt "a red square" \
    --width 32 --height 32 --num_inference_steps 2 --dtype float32 --output s-lora.png --torch_num_threads 1
cmp -s s-main.png s-lora.png && fail "the LoRA from the cache changed nothing"
ln -s "../../blobs/$hash" "$lora_repo/snapshots/$lora_commit/other.safetensors"
rm "$lora_repo/snapshots/$lora_commit/pytorch_lora_weights.safetensors"
ln -s "../../blobs/$hash" "$lora_repo/snapshots/$lora_commit/another.safetensors"
expect 2 "holds several .safetensors files (another.safetensors, other.safetensors): name one" -- \
  "$remat" sample --pipeline black-forest-labs/FLUX.1-Krea-dev --lora someone/my-flux-lora --prompt "a red square" \
    --width 32 --height 32 --num_inference_steps 2 --output s-x.png
expect 2 "someone/other-lora (revision main) is not in the Hugging Face cache" -- \
  "$remat" sample --pipeline black-forest-labs/FLUX.1-Krea-dev --lora someone/other-lora --prompt "a red square" \
    --width 32 --height 32 --num_inference_steps 2 --output s-x.png

[[ $failures -eq 0 ]] || { echo "$failures failure(s)"; exit 1; }
echo "ok: models from the hub cache"
