#!/usr/bin/env bash
# SimpleTuner-style configs (tests/cli/simpletuner_configs/) run unchanged: each trains for 2 steps
# with only the one grouped warning about SimpleTuner options remat ignores, or stops with the
# documented unsupported-computation errors for exactly the keys EXPECTED names (and then trains
# with --ignore_unsupported_options). None may fail on vocabulary. Flags point every config at
# tiny shapes (--pretrained_transformer_config), weights and a small latent cache, as a user would
# point a real config at their own.
# Usage: simpletuner_configs_test.sh <remat binary> <configs dir>
set -u
remat=$1
configs=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0

# Tiny transformers (diffusers config.json keys) and data of matching widths.
cat > "$work/flux.json" <<'EOF'
{"num_layers": 2, "num_single_layers": 2, "num_attention_heads": 2, "attention_head_dim": 32,
 "axes_dims_rope": [8, 12, 12], "joint_attention_dim": 32, "pooled_projection_dim": 16,
 "in_channels": 64, "guidance_embeds": true}
EOF
cat > "$work/mageflow.json" <<'EOF'
{"hidden_size": 64, "num_heads": 2, "depth": 2, "axes_dim": [8, 12, 12], "context_in_dim": 32}
EOF
for family in flux mageflow; do
  "$remat" make-demo-data --output "$work/$family-data" --model_family "$family" --samples 8 --size 8 \
      --text_tokens 8 --joint_dim 32 --pooled_dim 16 > /dev/null || { echo "FAIL: make-demo-data $family"; exit 1; }
  "$remat" init --model_family "$family" --pretrained_transformer_config "$work/$family.json" \
      --output "$work/$family.safetensors" > /dev/null || { echo "FAIL: init $family"; exit 1; }
done

# Warnings a run may give besides the grouped one: facts about this machine, not about options.
allowed_warning='offloads CUDA tensors to pinned host memory'

# Validation images need a Flux pipeline folder's text encoders and VAE; these runs point the configs
# at a latent cache and a bare transformer file, as a user without those would, so they turn
# validation off as that user must (the refusal without it is checked at the end).
train() {  # train <config> <family> <name> [flags...]
  local config=$1 family=$2 name=$3
  shift 3
  "$remat" train --config "$config" --instance_data_dir="$work/$family-data" \
      --pretrained_transformer_config="$work/$family.json" --pretrained_model_name_or_path="$work/$family.safetensors" \
      --max_train_steps=2 --output_dir="$work/out/$name" --torch_num_threads=1 --validation_disable=true "$@" 2>&1
}

check_trains() {  # check_trains <label> <exit code> <output>
  local label=$1 status=$2 out=$3
  local grouped others errors
  grouped=$(grep -c '^warning: \[train\] [0-9]* SimpleTuner options\? that remat does not implement' <<<"$out")
  others=$(grep '^warning:' <<<"$out" | grep -v 'SimpleTuner options\? that remat does not implement' | grep -v "$allowed_warning")
  errors=$(grep '^remat train: error:' <<<"$out")
  if [[ $status -ne 0 || $grouped -ne 1 || -n "$others" || -n "$errors" ]] || ! grep -q '^summary: 2 steps' <<<"$out"; then
    echo "FAIL: $label: exit $status, $grouped grouped warnings; other warnings: ${others:-none}; output:"
    echo "$out" | head -20
    failures=$((failures + 1))
    return
  fi
  echo "ok: $label trains ($(grep -o '^warning: \[train\] [0-9]* SimpleTuner options\?' <<<"$out" | grep -o '[0-9]*' | head -1) SimpleTuner options listed)"
}

# Lines for one kind of build only (EXPECTED's header): this build's kind from `remat --version`.
if "$remat" --version | grep -q '^float8 base weights: yes'; then
  build_kind=float8
else
  build_kind=no-float8
fi
echo "build: $build_kind"

while read -r file outcome keys; do
  [[ -z "$file" || "$file" == \#* ]] && continue
  if [[ $file == *: ]]; then
    [[ ${file%:} == "$build_kind" ]] || continue
    read -r file outcome keys <<<"$outcome $keys"
  fi
  config="$configs/$file"
  family=${file%%-*}
  name=${file%.*}
  out=$(train "$config" "$family" "$name")
  status=$?
  if [[ $outcome == trains ]]; then
    check_trains "$file" $status "$out"
    continue
  fi
  # stops: exit 2, every error an unsupported-computation error, naming exactly the expected keys.
  named=$(grep '^remat train: error:' <<<"$out" | sed -n 's/^remat train: error: \[train\] \([a-z_0-9]*\)=.* is not supported by remat yet: .*--ignore_unsupported_options to train without it$/\1/p' | sort | tr '\n' ' ')
  all_errors=$(grep -c '^remat train: error:' <<<"$out")
  want=$(tr ' ' '\n' <<<"$keys" | sort | tr '\n' ' ')
  if [[ $status -ne 2 || "$named" != "$want" || $all_errors -ne $(wc -w <<<"$keys") ]]; then
    echo "FAIL: $file: exit $status (want 2); named: [$named] want: [$want]; $all_errors errors; output:"
    echo "$out" | head -20
    failures=$((failures + 1))
    continue
  fi
  echo "ok: $file stops naming $(wc -w <<<"$keys") unsupported keys"
  out=$(train "$config" "$family" "$name-ignored" --ignore_unsupported_options)
  status=$?
  if ! grep -q 'ignored because of --ignore_unsupported_options' <<<"$out"; then
    echo "FAIL: $file with --ignore_unsupported_options does not list the ignored keys; output:"
    echo "$out" | head -20
    failures=$((failures + 1))
    continue
  fi
  check_trains "$file --ignore_unsupported_options" $status "$out"
done < "$configs/EXPECTED"

# Without --validation_disable, a config asking for validation images (validation_prompt) stops
# before any work with the reason and the way out, instead of training without its images.
out=$("$remat" train --config "$configs/flux-lora-2.json" --instance_data_dir="$work/flux-data" \
    --pretrained_transformer_config="$work/flux.json" --pretrained_model_name_or_path="$work/flux.safetensors" \
    --max_train_steps=2 --output_dir="$work/out/validation-refused" --torch_num_threads=1 2>&1)
status=$?
if [[ $status -ne 2 ]] || ! grep -q "validation images are rendered with the pipeline's text encoders and VAE.*validation_disable=true" <<<"$out" \
    || [[ -e "$work/out/validation-refused/metrics.jsonl" ]]; then
  echo "FAIL: flux-lora-2.json without a pipeline folder: exit $status (want 2) and the validation error; output:"
  echo "$out" | head -20
  failures=$((failures + 1))
else
  echo "ok: flux-lora-2.json without a pipeline folder stops: validation needs the pipeline's encoders"
fi

if ((failures)); then
  echo "$failures SimpleTuner config checks failed"
  exit 1
fi
echo "all SimpleTuner config checks passed"
