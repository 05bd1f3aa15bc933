#!/usr/bin/env bash
# The CLI reports bad input with the option / value / file and exits with code 2, before any
# work starts. Usage: cli_test.sh <remat binary>
set -u
remat=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0

# expect <exit code> <text the error must contain> -- <command...>
expect() {
  local code=$1 text=$2
  shift 3
  local out status
  out=$("$@" 2>&1)
  status=$?
  if [[ $status -ne $code ]] || [[ "$out" != *"$text"* ]]; then
    echo "FAIL: '$*' exited $status (want $code), output:"
    echo "$out" | head -5
    echo "  (wanted it to contain: $text)"
    failures=$((failures + 1))
  else
    echo "ok: $* -> $status"
  fi
}

expect 2 "gradient_checkpointing_interval must be" -- "$remat" train --gradient_checkpointing_interval=0
expect 2 "got '-3'" -- "$remat" train --gradient_checkpointing_interval=-3
expect 2 "gradient_checkpointing_segment_stride" -- "$remat" train --gradient_checkpointing_interval=4 --gradient_checkpointing_segment_stride=2
expect 2 "gradient_checkpointing_backend" -- "$remat" train --gradient_checkpointing_backend=cuda-magic
expect 2 "did you mean" -- "$remat" train --gradient_checkpointing_intervall=2
expect 2 "learning_rate" -- "$remat" train --learning_rate=fast
expect 0 "gradient_checkpointing_interval" -- "$remat" train --help
expect 2 "unknown command" -- "$remat" frobnicate

# Several bad options in one run: every one is reported (one line each), exit code 2.
out=$("$remat" train --lora_rank=0 --learning_rate=fast --gradient_checkpointing_intervl=2 \
      --model_flavour=mageflow-tiny --device=tpu 2>&1)
status=$?
missing=""
for text in "lora_rank must be" "learning_rate must be" "unknown option 'gradient_checkpointing_intervl'" \
            "model_flavour must be one of" "device must be"; do
  [[ "$out" == *"$text"* ]] || missing="$missing [$text]"
done
if [[ $status -ne 2 || -n "$missing" ]]; then
  echo "FAIL: several bad options: exit $status, missing:$missing; output:"
  echo "$out" | head -10
  failures=$((failures + 1))
else
  echo "ok: five bad options reported in one run -> $status"
fi
# SimpleTuner's keys: the ones that change what training computes stop the run (exit 2) naming
# the key and the way out; unknown keys are one error; a config file's format follows its name.
expect 2 "base_model_precision=int8-quanto is not supported by remat yet" -- "$remat" train --base_model_precision=int8-quanto
expect 2 "pass --ignore_unsupported_options to train without it" -- "$remat" train --use_ema=true
expect 2 "unknown options 'frobnicate', 'lora_rnk' (did you mean 'lora_rank'?)" -- "$remat" train --frobnicate=1 --lora_rnk=2
printf 'lora_rank = = 2\n' > "$work/bad.toml"
expect 2 "config must be valid TOML" -- "$remat" train --config "$work/bad.toml"
printf 'lora_rank: 2\n' > "$work/config.yaml"
expect 2 "config must be a .json, .toml or .env file" -- "$remat" train --config "$work/config.yaml"
expect 2 "optimizer must be one of adamw_bf16, torch-adamw, optimi-lion" -- "$remat" train --optimizer=prodigy

# Old flag spellings still work, with a deprecation note.
expect 0 "--model is deprecated; use --model_family" -- "$remat" init --model flux --preset flux-tiny --output "$work/old.safetensors"
expect 2 "layout must be off, N, N/S" -- "$remat" bench --model_family flux --layouts off,nope
expect 2 "--model_family" -- "$remat" init --model_family sdxl --output "$work/w.safetensors"

# Model I/O: a tiny Flux, inputs with a missing key, a wrong dtype, a wrong shape, a corrupt file.
"$remat" init --model_family flux --model_flavour flux-tiny --seed 0 --output "$work/w.safetensors" > /dev/null || failures=$((failures + 1))
printf 'abc' > "$work/short.safetensors"
expect 2 "short.safetensors" -- "$remat" forward --model_family flux --model_flavour flux-tiny --weights "$work/short.safetensors" --inputs "$work/w.safetensors" --output "$work/o.safetensors"
expect 2 "missing: " -- "$remat" forward --model_family flux --model_flavour flux-tiny --weights "$work/w.safetensors" --inputs "$work/w.safetensors" --output "$work/o.safetensors"
expect 2 "shape-mismatched" -- "$remat" forward --model_family flux --model_flavour flux-small --weights "$work/w.safetensors" --inputs "$work/w.safetensors" --output "$work/o.safetensors"
[[ ! -e "$work/o.safetensors" ]] || { echo "FAIL: an output was written after an error"; failures=$((failures + 1)); }

if ((failures)); then
  echo "$failures CLI checks failed"
  exit 1
fi
echo "all CLI checks passed"
