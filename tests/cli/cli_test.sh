#!/usr/bin/env bash
# The CLI reports bad input with the option / value / file and exits with code 2, before any
# work starts. Usage: cli_test.sh <remat binary>
set -u
remat=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/expect.sh"

expect 2 "gradient_checkpointing_interval must be" -- "$remat" train --gradient_checkpointing_interval=0
expect 2 "got '-3'" -- "$remat" train --gradient_checkpointing_interval=-3
expect 2 "gradient_checkpointing_segment_stride" -- "$remat" train --gradient_checkpointing_interval=4 --gradient_checkpointing_segment_stride=2
expect 2 "gradient_checkpointing_backend" -- "$remat" train --gradient_checkpointing_backend=cuda-magic
expect 2 "did you mean" -- "$remat" train --gradient_checkpointing_intervall=2
expect 2 "learning_rate" -- "$remat" train --learning_rate=fast
expect 0 "gradient_checkpointing_interval" -- "$remat" train --help
expect 2 "unknown command" -- "$remat" frobnicate
expect 0 "LibTorch" -- "$remat" --version
# Without a CUDA device (a CPU build, or a CUDA build on a machine without one) --device cuda is
# refused by name before any work, by every command that takes it.
if "$remat" --version | grep -qE 'CPU build|; 0 CUDA devices visible'; then
  expect 2 "device must be cpu or auto on this machine (CUDA is not available), got 'cuda'" -- "$remat" train --device=cuda
  expect 2 "[bench] device must be cpu on this machine (no CUDA device available), got 'cuda'" -- \
    "$remat" bench --model_family flux --model_flavour flux-tiny --device cuda
fi

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
expect 2 "base_model_precision=int4-quanto is not supported by remat yet" -- "$remat" train --base_model_precision=int4-quanto
expect 2 "pass --ignore_unsupported_options to train without it" -- "$remat" train --crepa_enabled=true
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

# ---- Malformed inputs and faults (issue 9): each is a named error with exit code 2, found before
# any model or data loads and before anything is written. Small inputs live in
# tests/data/regressions; large ones (100k-deep JSON) are generated here.
regressions="$(cd "$(dirname "$0")/../data/regressions" && pwd)"
deep=$(head -c 100000 /dev/zero | tr '\0' '[')$(head -c 100000 /dev/zero | tr '\0' ']')
u64le() { local n=$1 i; for i in 0 1 2 3 4 5 6 7; do printf "\\x$(printf %02x $(((n >> (8 * i)) & 255)))"; done; }
header_length() { od -An -t u8 -N 8 "$1" | tr -d ' '; }
# expect_quick: as expect, but the command must finish within 60 s (a hang or an allocation bomb
# fails instead of stalling the suite).
expect_quick() { local code=$1 text=$2; shift 3; expect "$code" "$text" -- timeout 60 "$@"; }
# A tiny Flux run's data (flux-tiny widths) and the flags of a short run on it.
"$remat" make-demo-data --output "$work/data" --samples 4 --size 8 --text_tokens 8 --joint_dim 32 --pooled_dim 16 > /dev/null \
  || failures=$((failures + 1))
tiny=(--model_family=flux --model_flavour=flux-tiny --instance_data_dir="$work/data" --train_batch_size=2
      --mixed_precision=no --lora_rank=2 --report_every=1 --num_threads=1)

# 1. 100k-deep JSON: a config value, a safetensors __metadata__ (stack overflow before).
printf '{"seed": %s}' "$deep" > "$work/deep.json"
expect_quick 2 "nests arrays and objects deeper than 64 levels" -- "$remat" train --config "$work/deep.json"
meta="{\"__metadata__\":{\"k\":$deep}}"
{ u64le ${#meta}; printf '%s' "$meta"; } > "$work/deep.safetensors"
expect_quick 2 "header nests arrays and objects deeper than 64 levels" -- "$remat" forward --model_family flux --model_flavour flux-tiny --weights "$work/deep.safetensors" --inputs "$work/w.safetensors" --output "$work/o.safetensors"

# 2. A checkpoint's state.json with a negative batch_in_epoch (a crash on resume before).
"$remat" train "${tiny[@]}" --output_dir="$work/ckpt" --max_train_steps=2 > /dev/null 2>&1 || failures=$((failures + 1))
cp "$regressions/state_negative_batch_in_epoch.json" "$work/ckpt/checkpoint-2/state.json"
expect_quick 2 "state.json': batch_in_epoch must be an integer in [0, " -- "$remat" train "${tiny[@]}" --output_dir="$work/ckpt" --max_train_steps=4

# 3. Weights whose header length is one byte short (every float read one byte early, exit 0
#    before) and weights with bytes appended.
n=$(header_length "$work/w.safetensors")
{ head -c $((8 + n)) "$work/w.safetensors"; printf ' '; tail -c +$((9 + n)) "$work/w.safetensors"; } > "$work/short_header.safetensors"
expect_quick 2 "the header length is wrong" -- "$remat" forward --model_family flux --model_flavour flux-tiny --weights "$work/short_header.safetensors" --inputs "$work/w.safetensors" --output "$work/o.safetensors"
{ cat "$work/w.safetensors"; printf 'tail'; } > "$work/appended.safetensors"
expect_quick 2 "or bytes were appended" -- "$remat" forward --model_family flux --model_flavour flux-tiny --weights "$work/appended.safetensors" --inputs "$work/w.safetensors" --output "$work/o.safetensors"

# 4. Counts and shapes from files and flags: overflow-checked and bounded before allocating.
"$remat" init --model_family mageflow --model_flavour mageflow-tiny --output "$work/mw.safetensors" > /dev/null || failures=$((failures + 1))
expect_quick 2 "h x w = 4294967296 x 4294967296 overflows int64" -- "$remat" forward --model_family mageflow --model_flavour mageflow-tiny --weights "$work/mw.safetensors" --inputs "$regressions/mageflow_img_shapes_2e32.safetensors" --output "$work/o.safetensors"
expect_quick 2 "img_cu_seqlens must end at 4 (image tokens), got 268435456" -- "$remat" forward --model_family mageflow --model_flavour mageflow-tiny --weights "$work/mw.safetensors" --inputs "$regressions/mageflow_img_cu_seqlens_2e28.safetensors" --output "$work/o.safetensors"
expect_quick 2 "num_layers must be in [0, 1024], got 1000000000" -- "$remat" init --model_family flux --pretrained_transformer_config "$regressions/flux_config_num_layers_1e9.json" --output "$work/x.safetensors"
expect_quick 2 "num_train_epochs must be an integer in [0, 1000000]" -- "$remat" train --num_train_epochs=9223372036854775807
expect_quick 2 "seed must be an integer in [0, 4294967295]" -- "$remat" init --model_flavour flux-tiny --seed 99999999999999999999 --output "$work/x.safetensors"
expect_quick 2 "seed must be an integer in [0, 4294967295]" -- "$remat" make-demo-data --output "$work/seed-data" --seed 99999999999999999999
expect_quick 2 "needs about" -- "$remat" make-demo-data --output "$work/huge-data" --size 4096 --text_tokens 65536 --joint_dim 65536
expect_quick 0 "wrote 3 pictures with captions" -- "$remat" make-demo-images --output "$work/pictures" --count 3 --size 16
expect_quick 2 "the output directory '$work/pictures' is not empty" -- "$remat" make-demo-images --output "$work/pictures" --count 3 --size 16
expect_quick 2 "size: Value 8 not in range" -- "$remat" make-demo-images --output "$work/small-pictures" --size 8

# 5. Memory admission: flux-dev (no flavour given: the family's default, 12B parameters) is
#    refused in seconds with both figures (the kernel's OOM killer ended it before).
available_kib=$(awk '/^MemAvailable:/ {print $2}' /proc/meminfo)
if ((available_kib > 44 * 1024 * 1024)); then
  echo "skip: memory admission of flux-dev (this machine has more than the 44 GiB it needs)"
else
start=$SECONDS
expect_quick 2 "[memory] krea (11,901,408,320 parameters, 11,901,408,320 trainable) full training needs" -- "$remat" train --model_family flux --pretrained_model_name_or_path=random --instance_data_dir "$work/data" --output_dir "$work/dev"
expect_quick 2 "--model_flavour=flux-tiny (7.46 MiB)" -- "$remat" train --model_family flux --pretrained_model_name_or_path=random --instance_data_dir "$work/data" --output_dir "$work/dev"
((SECONDS - start < 60)) || { echo "FAIL: admission took $((SECONDS - start)) s"; failures=$((failures + 1)); }
[[ ! -e "$work/dev/metrics.jsonl" ]] || { echo "FAIL: metrics.jsonl written before admission"; failures=$((failures + 1)); }
expect_quick 2 "[memory] flux-dev" -- "$remat" init --model_family flux --model_flavour flux-dev --output "$work/x.safetensors"
fi
expect_quick 0 "wrote" -- "$remat" init --model_flavour flux-tiny --skip_memory_check --output "$work/x.safetensors"

# 6. Nothing blocks: a FIFO as a file path, 100000 threads.
mkfifo "$work/fifo"
mkfifo "$work/fifo.json"
expect_quick 2 "(a FIFO)" -- "$remat" forward --model_family flux --model_flavour flux-tiny --weights "$work/fifo" --inputs "$work/w.safetensors" --output "$work/o.safetensors"
expect_quick 2 "(a FIFO)" -- "$remat" train --config "$work/fifo.json"
expect_quick 2 "(a FIFO)" -- "$remat" init --model_family flux --pretrained_transformer_config "$work/fifo" --output "$work/x.safetensors"
expect_quick 2 "num_threads must be an integer in [0, 1024], got '100000'" -- "$remat" bench --model_family flux --num_threads 100000

# 7. Named errors, not raw ones with exit 1: a checkpoint name past int64, an output_dir that is
#    a file, symlink loops in the data or output directory.
mkdir -p "$work/names/checkpoint-99999999999999999999"
expect_quick 2 "checkpoint-99999999999999999999' is named like a checkpoint" -- "$remat" train "${tiny[@]}" --output_dir="$work/names" --max_train_steps=1
printf 'x' > "$work/a-file"
expect_quick 2 "output_dir must be a writable directory, got '$work/a-file': it is not a directory" -- "$remat" train "${tiny[@]}" --output_dir="$work/a-file" --max_train_steps=1
ln -s "$work/loop" "$work/loop"
expect_quick 2 "output_dir must be a writable directory, got '$work/loop': Too many levels of symbolic links" -- "$remat" train "${tiny[@]}" --output_dir="$work/loop" --max_train_steps=1
cp -r "$work/data" "$work/loop-data" && ln -s "$work/loop-data/x.safetensors" "$work/loop-data/x.safetensors"
expect_quick 2 "x.safetensors' cannot be read: Too many levels of symbolic links" -- "$remat" train "${tiny[@]}" --instance_data_dir="$work/loop-data" --output_dir="$work/loop-out" --max_train_steps=1

# 8. Nothing written before an error: data of another width, an unwritable bench report; stale
#    temporary checkpoints removed; SIGTERM saves a checkpoint like Ctrl-C.
"$remat" make-demo-data --output "$work/wide" --samples 2 --size 8 --text_tokens 8 --joint_dim 64 --pooled_dim 16 > /dev/null || failures=$((failures + 1))
expect_quick 2 "holds samples with prompt_embeds width D = 64" -- "$remat" train "${tiny[@]}" --instance_data_dir="$work/wide" --output_dir="$work/wide-out" --max_train_steps=1
[[ ! -e "$work/wide-out/metrics.jsonl" ]] || { echo "FAIL: metrics.jsonl written before the data check"; failures=$((failures + 1)); }
out=$(timeout 60 "$remat" bench --model_family flux --layouts off --steps 1 --warmup 0 --json "$work" 2>&1)
status=$?
if [[ $status -ne 2 || "$out" != *"--json must be a file in a writable directory"* || "$out" == *"predicted peak"* ]]; then
  echo "FAIL: bench --json DIR: exit $status (want 2, before the run); output:"; echo "$out" | head -5
  failures=$((failures + 1))
else
  echo "ok: bench --json DIR -> 2 before the run"
fi
mkdir -p "$work/stale/.tmp-checkpoint-9-123"
"$remat" train "${tiny[@]}" --output_dir="$work/stale" --max_train_steps=1 > /dev/null 2>&1 || failures=$((failures + 1))
[[ ! -e "$work/stale/.tmp-checkpoint-9-123" ]] && echo "ok: stale .tmp-checkpoint-* removed" \
  || { echo "FAIL: stale .tmp-checkpoint-9-123 left in place"; failures=$((failures + 1)); }
"$remat" train "${tiny[@]}" --output_dir="$work/term" --max_train_steps=100000 --checkpointing_steps=0 > "$work/term.log" 2>&1 &
pid=$!
for _ in $(seq 600); do [[ -s "$work/term/metrics.jsonl" ]] && break; sleep 0.1; done
kill -TERM $pid
wait $pid
status=$?
if [[ $status -eq 143 ]] && ls -d "$work"/term/checkpoint-* > /dev/null 2>&1 && grep -q "SIGTERM: saving a checkpoint" "$work/term.log"; then
  echo "ok: SIGTERM saved $(ls -d "$work"/term/checkpoint-* | head -1 | xargs basename) and exited 143"
else
  echo "FAIL: SIGTERM: exit $status (want 143), checkpoints: $(ls "$work/term" 2>&1 | tr '\n' ' ')"
  tail -3 "$work/term.log"
  failures=$((failures + 1))
fi

# 9. A diffusers pipeline folder as the model (docs/PIPELINE_FOLDER.md): make-demo-pipeline, a
#    2-step run from it; broken folders exit 2 naming the folder, the component or the shard.
expect 0 "wrote a Flux.1 pipeline folder" -- "$remat" make-demo-pipeline --output "$work/pipe" --transformer_shards 2
[[ -f "$work/pipe/model_index.json" && -f "$work/pipe/transformer/diffusion_pytorch_model.safetensors.index.json" \
   && -f "$work/pipe/scheduler/scheduler_config.json" ]] && echo "ok: pipeline folder layout" \
  || { echo "FAIL: make-demo-pipeline layout: $(ls -R "$work/pipe" | tr '\n' ' ')"; failures=$((failures + 1)); }
expect_quick 0 "transformer: $work/pipe/transformer (pipeline folder $work/pipe)" -- "$remat" train "${tiny[@]}" --pretrained_model_name_or_path="$work/pipe" --output_dir="$work/pipe-out" --max_train_steps=2
expect_quick 2 "already holds a model_index.json" -- "$remat" make-demo-pipeline --output "$work/pipe"
mkdir -p "$work/not-a-pipe"
expect_quick 2 "pretrained_model_name_or_path '$work/not-a-pipe' is a directory but neither a diffusers pipeline folder" -- "$remat" train "${tiny[@]}" --pretrained_model_name_or_path="$work/not-a-pipe" --output_dir="$work/np-out" --max_train_steps=1
cp -r "$work/pipe" "$work/pipe-no-transformer" && rm -rf "$work/pipe-no-transformer/transformer"
expect_quick 2 "pipeline folder '$work/pipe-no-transformer': component 'transformer' needs the directory" -- "$remat" train "${tiny[@]}" --pretrained_model_name_or_path="$work/pipe-no-transformer" --output_dir="$work/nt-out" --max_train_steps=1
cp -r "$work/pipe" "$work/pipe-no-shard" && rm "$work/pipe-no-shard/transformer/diffusion_pytorch_model-00001-of-"*.safetensors
expect_quick 2 "to shard 'diffusion_pytorch_model-00001-of-" -- "$remat" train "${tiny[@]}" --pretrained_model_name_or_path="$work/pipe-no-shard" --output_dir="$work/ns-out" --max_train_steps=1
cp -r "$work/pipe" "$work/pipe-bad-index" && printf '{"_class_name": "FluxPipeline", "transformer": [1, 2]}' > "$work/pipe-bad-index/model_index.json"
expect_quick 2 "component 'transformer' must be [library, class] (two strings) or [null, null], got [1,2]" -- "$remat" train "${tiny[@]}" --pretrained_model_name_or_path="$work/pipe-bad-index" --output_dir="$work/bi-out" --max_train_steps=1
expect_quick 2 "the override for component 'transformer' must be a directory" -- "$remat" train "${tiny[@]}" --pretrained_model_name_or_path="$work/pipe" --pretrained_transformer_model_name_or_path="$work/nowhere" --output_dir="$work/ov-out" --max_train_steps=1

# 10. `remat encode` on the demo pipeline (docs/PIPELINE_FOLDER.md): a picture and a caption become
#     a latent-cache sample that trains the folder's transformer; broken encoders exit 2 naming the file.
python3 -c "
w, h = 50, 37
pixels = bytes((x * 5 + y * 3 + c * 80) % 256 for y in range(h) for x in range(w) for c in range(3))
open('$work/picture.ppm', 'wb').write(b'P6\\n%d %d\\n255\\n' % (w, h) + pixels)"
mkdir -p "$work/encoded"
expect_quick 0 "centre-cropped to 48 x 36" -- "$remat" encode --pretrained_model_name_or_path="$work/pipe" --image="$work/picture.ppm" --caption="a red boat on a lake" --tokenizer_max_length=16 --output="$work/encoded/boat.safetensors"
expect_quick 0 "latents (mean): [16, 18, 24]" -- "$remat" encode --pretrained_model_name_or_path="$work/pipe" --image="$work/picture.ppm" --vae_enable_tiling --latents=mean
expect_quick 0 "prompt_embeds: [16, 32]" -- "$remat" encode --pretrained_model_name_or_path="$work/pipe" --caption="a red boat on a lake" --tokenizer_max_length=16 --dtype=float32
expect_quick 0 "truncated because \`max_sequence_length\` is set to 4 tokens" -- "$remat" encode --pretrained_model_name_or_path="$work/pipe" --caption="a red boat on a calm lake" --tokenizer_max_length=4
cp "$work/encoded/boat.safetensors" "$work/encoded/boat2.safetensors"
expect_quick 0 "summary: 2 steps" -- "$remat" train --pretrained_model_name_or_path="$work/pipe" --instance_data_dir="$work/encoded" --output_dir="$work/enc-out" --max_train_steps=2 --train_batch_size=1 --lora_rank=2 --num_threads=1
expect_quick 2 "nothing to encode: give --image, --caption or both" -- "$remat" encode --pretrained_model_name_or_path="$work/pipe"
cp -r "$work/pipe" "$work/pipe-no-t5" && rm -rf "$work/pipe-no-t5/text_encoder_2"
expect_quick 2 "component 'text_encoder_2' needs the directory" -- "$remat" encode --pretrained_model_name_or_path="$work/pipe-no-t5" --caption=boat
cp -r "$work/pipe" "$work/pipe-t5-shard" && rm "$work/pipe-t5-shard/text_encoder_2/model-00001-of-"*.safetensors
expect_quick 2 "to shard 'model-00001-of-" -- "$remat" encode --pretrained_model_name_or_path="$work/pipe-t5-shard" --caption=boat
cp -r "$work/pipe" "$work/pipe-keys" && cp "$work/pipe/text_encoder/model.safetensors" "$work/pipe-keys/vae/diffusion_pytorch_model.safetensors"
expect_quick 2 "encoder.conv_in.weight" -- "$remat" encode --pretrained_model_name_or_path="$work/pipe-keys" --image="$work/picture.ppm"
cp -r "$work/pipe" "$work/pipe-tok" && printf 'not a model' > "$work/pipe-tok/tokenizer_2/spiece.model"
expect_quick 2 "$work/pipe-tok/tokenizer_2/spiece.model" -- "$remat" encode --pretrained_model_name_or_path="$work/pipe-tok" --caption=boat
cp -r "$work/pipe" "$work/pipe-act" && sed -i 's/"silu"/"swish2"/' "$work/pipe-act/vae/config.json"
expect_quick 2 "swish2" -- "$remat" encode --pretrained_model_name_or_path="$work/pipe-act" --image="$work/picture.ppm"
printf 'not a picture' > "$work/notes.png"
expect_quick 2 "is not a picture remat can read" -- "$remat" encode --pretrained_model_name_or_path="$work/pipe" --image="$work/notes.png"

# 11. Image runs (docs/YOUR_DATA.md): `remat cache` computes the VAE-latent and text-embedding
#     caches of a folder of pictures and reuses them the next time; `remat train` on the folder
#     trains; a backend type remat does not implement exits 2 naming it, before any model loads.
python3 "$(dirname "$0")/two_squares.py" "$work/pics"
images=(--pretrained_model_name_or_path="$work/pipe" --instance_data_dir="$work/pics" --cache_dir="$work/pics-cache"
        --resolution=32 --resolution_type=pixel --mixed_precision=no)
expect_quick 0 "VAE latents: 2 encoded" -- "$remat" cache "${images[@]}"
printf '{"pretrained_model_name_or_path": "%s", "instance_data_dir": "%s", "cache_dir": "%s", "resolution": 32, "resolution_type": "pixel", "mixed_precision": "no"}\n' \
  "$work/pipe" "$work/pics" "$work/pics-cache" > "$work/cache-config.json"
expect_quick 0 "text embeddings: 0 encoded" -- "$remat" cache --config "$work/cache-config.json"
expect_quick 0 "summary: 2 steps" -- "$remat" train "${images[@]}" --output_dir="$work/pics-out" --max_train_steps=2 --train_batch_size=2 --model_type=lora --lora_rank=2
expect_quick 2 "nothing to cache" -- "$remat" cache --pretrained_model_name_or_path=random --instance_data_dir="$work/data"
printf '[{"id": "in-the-cloud", "type": "aws", "aws_bucket_name": "b"}]\n' > "$work/aws.json"
expect_quick 2 "in-the-cloud" -- "$remat" train --pretrained_model_name_or_path="$work/pipe" --data_backend_config="$work/aws.json" --output_dir="$work/aws-out"
[[ ! -e "$work/aws-out/metrics.jsonl" ]] && echo "ok: a bad backend writes nothing" \
  || { echo "FAIL: a bad backend wrote $work/aws-out/metrics.jsonl"; failures=$((failures + 1)); }

# Weight formats (issue 13): the tiny model converted to Black Forest Labs' single-file layout by the
# script below (diffusers' convert_flux_transformer_checkpoint_to_diffusers read backwards, on the
# raw bytes) runs to the same output as the diffusers file, its config read from its shapes.
python3 - "$work/w.safetensors" "$work/w_bfl.safetensors" "$work/fwd_in.safetensors" <<'PY'
import json, re, struct, sys
src, dst, inputs = sys.argv[1:4]
raw = open(src, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n]); data = raw[8 + n:]
header.pop("__metadata__", None)
def get(k):
    e = header.pop(k); b, f = e["data_offsets"]; return e["dtype"], e["shape"], data[b:f]
out = {}
def move(bfl, d): out[bfl] = get(d)
def cat(bfl, parts):  # row-major: concatenating along dim 0 is concatenating the bytes
    ts = [get(p) for p in parts]
    out[bfl] = (ts[0][0], [sum(t[1][0] for t in ts)] + ts[0][1][1:], b"".join(t[2] for t in ts))
def write(path, tensors):
    hdr, blobs, off = {}, [], 0
    for k, (dt, shape, blob) in tensors.items():
        hdr[k] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(blob)]}; blobs.append(blob); off += len(blob)
    h = json.dumps(hdr).encode(); h += b" " * (-len(h) % 8)
    open(path, "wb").write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
count = lambda p: 1 + max(int(m.group(1)) for k in header if (m := re.match(p + r"\.(\d+)\.", k)))
double, single = count("transformer_blocks"), count("single_transformer_blocks")
for wb in ("weight", "bias"):
    for e, b in (("timestep_embedder", "time_in"), ("text_embedder", "vector_in"), ("guidance_embedder", "guidance_in")):
        move(f"{b}.in_layer.{wb}", f"time_text_embed.{e}.linear_1.{wb}"); move(f"{b}.out_layer.{wb}", f"time_text_embed.{e}.linear_2.{wb}")
    move(f"txt_in.{wb}", f"context_embedder.{wb}"); move(f"img_in.{wb}", f"x_embedder.{wb}")
    for i in range(double):
        b, t = f"double_blocks.{i}.", f"transformer_blocks.{i}."
        for bfl, d in (("img_mod.lin", "norm1.linear"), ("txt_mod.lin", "norm1_context.linear"), ("img_mlp.0", "ff.net.0.proj"),
                       ("img_mlp.2", "ff.net.2"), ("txt_mlp.0", "ff_context.net.0.proj"), ("txt_mlp.2", "ff_context.net.2"),
                       ("img_attn.proj", "attn.to_out.0"), ("txt_attn.proj", "attn.to_add_out")):
            move(f"{b}{bfl}.{wb}", f"{t}{d}.{wb}")
        cat(f"{b}img_attn.qkv.{wb}", [f"{t}attn.to_{x}.{wb}" for x in "qkv"])
        cat(f"{b}txt_attn.qkv.{wb}", [f"{t}attn.add_{x}_proj.{wb}" for x in "qkv"])
    for i in range(single):
        b, t = f"single_blocks.{i}.", f"single_transformer_blocks.{i}."
        move(f"{b}modulation.lin.{wb}", f"{t}norm.linear.{wb}"); move(f"{b}linear2.{wb}", f"{t}proj_out.{wb}")
        cat(f"{b}linear1.{wb}", [f"{t}attn.to_{x}.{wb}" for x in "qkv"] + [f"{t}proj_mlp.{wb}"])
    move(f"final_layer.linear.{wb}", f"proj_out.{wb}")
    dt, shape, blob = get(f"norm_out.linear.{wb}")  # diffusers (scale, shift) -> BFL (shift, scale)
    out[f"final_layer.adaLN_modulation.1.{wb}"] = (dt, shape, blob[len(blob) // 2:] + blob[:len(blob) // 2])
for i in range(double):
    for s, d in (("img_attn.norm.query_norm", "norm_q"), ("img_attn.norm.key_norm", "norm_k"),
                 ("txt_attn.norm.query_norm", "norm_added_q"), ("txt_attn.norm.key_norm", "norm_added_k")):
        move(f"double_blocks.{i}.{s}.scale", f"transformer_blocks.{i}.attn.{d}.weight")
for i in range(single):
    for s, d in (("query_norm", "norm_q"), ("key_norm", "norm_k")):
        move(f"single_blocks.{i}.norm.{s}.scale", f"single_transformer_blocks.{i}.attn.{d}.weight")
assert not header, f"unconverted keys: {sorted(header)[:3]}"
write(dst, out)
f32 = lambda shape, seed: ("F32", list(shape), struct.pack(f"<{eval('*'.join(map(str, shape)))}f",
                            *[((seed * 7919 + j * 104729) % 1000) / 500.0 - 1.0 for j in range(eval('*'.join(map(str, shape))))]))
write(inputs, {"hidden_states": f32((1, 4, 64), 1), "encoder_hidden_states": f32((1, 3, 32), 2),
               "pooled_projections": f32((1, 16), 3), "timestep": ("F32", [1], struct.pack("<f", 0.6)),
               "img_ids": ("F32", [4, 3], struct.pack("<12f", 0, 0, 0, 0, 0, 1, 0, 1, 0, 0, 1, 1)),
               "txt_ids": ("F32", [3, 3], struct.pack("<9f", *[0] * 9)), "guidance": ("F32", [1], struct.pack("<f", 3.5))})
PY
expect_quick 0 "" -- "$remat" forward --model_family flux --model_flavour flux-tiny --weights "$work/w.safetensors" --inputs "$work/fwd_in.safetensors" --output "$work/fwd_diffusers.safetensors"
expect_quick 0 "" -- "$remat" forward --model_family flux --weights "$work/w_bfl.safetensors" --inputs "$work/fwd_in.safetensors" --output "$work/fwd_bfl.safetensors"
cmp -s "$work/fwd_diffusers.safetensors" "$work/fwd_bfl.safetensors" && echo "ok: BFL and diffusers weights give the same forward output" \
  || { echo "FAIL: the BFL file's forward output differs from the diffusers file's"; failures=$((failures + 1)); }
printf '{"num_layers": 4, "num_single_layers": 8, "attention_head_dim": 64, "num_attention_heads": 2, "joint_attention_dim": 64, "pooled_projection_dim": 32, "axes_dims_rope": [16, 24, 24]}\n' > "$work/small_config.json"
expect_quick 2 "img_in.weight has shape [64, 64], the model needs [128, 64]" -- "$remat" forward --model_family flux --pretrained_transformer_config "$work/small_config.json" --weights "$work/w_bfl.safetensors" --inputs "$work/fwd_in.safetensors" --output "$work/o.safetensors"
[[ ! -e "$work/o.safetensors" ]] || { echo "FAIL: an output was written after a refused BFL file"; failures=$((failures + 1)); }
# 12. `remat sample` on the demo pipeline (docs/SAMPLING.md): PNGs with their parameters in text
#     chunks, the same picture for the same seed, the LoRA trained in 11 merged; bad input exits 2
#     naming it, before any model loads, with no PNG written.
sample=(--pipeline="$work/pipe" --width=32 --height=48 --num_inference_steps=2 --dtype=float32)
expect_quick 0 "wrote $work/s1.png (32 x 48)" -- "$remat" sample "${sample[@]}" --prompt="a red square" --seed=5 --output="$work/s1.png"
expect_quick 0 "wrote $work/s2.png" -- "$remat" sample "${sample[@]}" --prompt="a red square" --seed=5 --output="$work/s2.png"
expect_quick 0 "wrote $work/s3.png" -- "$remat" sample "${sample[@]}" --prompt="a red square" --seed=6 --output="$work/s3.png"
cmp -s "$work/s1.png" "$work/s2.png" && echo "ok: same seed, same PNG" \
  || { echo "FAIL: the same seed gave different PNGs"; failures=$((failures + 1)); }
cmp -s "$work/s1.png" "$work/s3.png" && { echo "FAIL: seeds 5 and 6 gave the same PNG"; failures=$((failures + 1)); } \
  || echo "ok: another seed, another PNG"
expect_quick 0 "picture 1/1 step 2/2" -- "$remat" sample "${sample[@]}" --prompt="a red square" --output="$work/progress.png"
# The text chunks, read with a PNG chunk walk written here.
chunks=$(python3 - "$work/s1.png" <<'PY'
import struct, sys
data = open(sys.argv[1], "rb").read()
at, out = 8, []
while at + 12 <= len(data):
    n, kind = struct.unpack(">I4s", data[at:at + 8])
    if kind == b"tEXt":
        key, value = data[at + 8:at + 8 + n].split(b"\0", 1)
        out.append("%s=%s" % (key.decode("latin-1"), value.decode("latin-1")))
    at += 12 + n
print(";".join(out))
PY
)
want="prompt=a red square;negative_prompt=;seed=5;steps=2;guidance=3.5;true_cfg_scale=1;width=32;height=48;model=$work/pipe;loras=;base_model_precision=no_change;software=remat"
[[ "$chunks" == "$want" ]] && echo "ok: PNG text chunks" \
  || { echo "FAIL: PNG text chunks: $chunks (want $want)"; failures=$((failures + 1)); }
# Several prompts (a file and a flag): <stem>_001.png, ... in prompt order; a LoRA with a scale.
printf 'a blue square\n\na green square\r\n' > "$work/prompts.txt"
lora="$work/pics-out/pytorch_lora_weights.safetensors"
expect_quick 0 "wrote $work/many_003.png" -- "$remat" sample "${sample[@]}" --prompt="a red square" --prompt_file="$work/prompts.txt" --lora="$lora:0.5" --output="$work/many.png"
[[ -f "$work/many_001.png" && -f "$work/many_002.png" && ! -e "$work/many.png" ]] && echo "ok: numbered outputs" \
  || { echo "FAIL: numbered outputs: $(ls "$work" | grep many | tr '\n' ' ')"; failures=$((failures + 1)); }
expect_quick 0 "wrote $work/lora0.png" -- "$remat" sample "${sample[@]}" --prompt="a red square" --seed=5 --lora="$lora:0" --output="$work/lora0.png"
# The pixel data (IDAT onwards) is the same; the text chunks differ (loras).
python3 -c "import sys; a, b = (open(p, 'rb').read() for p in sys.argv[1:]); sys.exit(a[a.find(b'IDAT'):] != b[b.find(b'IDAT'):])" \
  "$work/s1.png" "$work/lora0.png" && echo "ok: a LoRA at scale 0 gives the base model's pixels" \
  || { echo "FAIL: a LoRA at scale 0 changed the picture"; failures=$((failures + 1)); }
# Bad input. LoRA files written here: an unknown format, and a PEFT LoRA whose shapes fit no flux-tiny layer.
python3 - "$work" <<'PY'
import json, struct, sys
def save(path, tensors):
    header, blob = {}, b""
    for key, shape in tensors.items():
        count = 1
        for s in shape: count *= s
        header[key] = {"dtype": "F32", "shape": shape, "data_offsets": [len(blob), len(blob) + 4 * count]}
        blob += struct.pack("<%df" % count, *([0.01] * count))
    text = json.dumps(header).encode()
    open(path, "wb").write(struct.pack("<Q", len(text)) + text + blob)
save(sys.argv[1] + "/unknown_lora.safetensors", {"model.some_layer.weight": [2, 2]})
save(sys.argv[1] + "/wide_lora.safetensors", {"transformer.transformer_blocks.0.attn.to_q.lora_A.weight": [2, 128],
                                               "transformer.transformer_blocks.0.attn.to_q.lora_B.weight": [128, 2]})
PY
expect_quick 2 "model.some_layer.weight" -- "$remat" sample "${sample[@]}" --prompt=x --lora="$work/unknown_lora.safetensors" --output="$work/bad1.png"
expect_quick 2 "a LoRA for another model shape" -- "$remat" sample "${sample[@]}" --prompt=x --lora="$work/wide_lora.safetensors" --output="$work/bad2.png"
expect_quick 2 "width must be a multiple of 4 for this pipeline's VAE (2x downsampling, then 2x2 packing), got 102" -- "$remat" sample --pipeline="$work/pipe" --prompt=x --width=102 --height=48 --output="$work/bad3.png"
cp -r "$work/pipe" "$work/pipe-no-vae" && rm -rf "$work/pipe-no-vae/vae"
expect_quick 2 "component 'vae' needs the directory" -- "$remat" sample --pipeline="$work/pipe-no-vae" --prompt=x --width=32 --height=32 --output="$work/bad4.png"
expect_quick 2 "--output must name a .png file" -- "$remat" sample "${sample[@]}" --prompt=x --output="$work/bad5.jpg"
expect_quick 2 "nothing to sample" -- "$remat" sample "${sample[@]}" --output="$work/bad6.png"
expect_quick 2 "missing_lora.safetensors" -- "$remat" sample "${sample[@]}" --prompt=x --lora="$work/missing_lora.safetensors:0.5" --output="$work/bad7.png"
printf 'a red square\n\xff\xfe not UTF-8\n' > "$work/bad-prompts.txt"
expect_quick 2 "--prompt_file '$work/bad-prompts.txt' line 2 is not valid UTF-8" -- "$remat" sample "${sample[@]}" --prompt_file="$work/bad-prompts.txt" --output="$work/bad8.png"
ls "$work"/bad*.png > /dev/null 2>&1 && { echo "FAIL: a PNG was written after an error: $(ls "$work"/bad*)"; failures=$((failures + 1)); } \
  || echo "ok: no PNG after bad input"

# Validation images (issue 13): bad options and runs that cannot render stop before any work.
expect 2 "validation_resolution must be N or WxH (pixels), or several separated by commas" -- "$remat" train --validation_resolution=1024x
expect 2 "validation_num_inference_steps must be an integer in [1, 1000]" -- "$remat" train --validation_num_inference_steps=0
expect_quick 2 "validation images are rendered with the pipeline's text encoders and VAE" -- "$remat" train "${tiny[@]}" --validation_prompt=x --output_dir="$work/val-nopipe" --max_train_steps=1
echo '{"cat": 3}' > "$work/bad-library.json"
expect_quick 2 "user_prompt_library '$work/bad-library.json' entry 'cat' must be a prompt string" -- "$remat" train "${tiny[@]}" --pretrained_model_name_or_path="$work/pipe" --user_prompt_library="$work/bad-library.json" --output_dir="$work/val-lib" --max_train_steps=1
[[ -e "$work/val-nopipe/metrics.jsonl" || -e "$work/val-lib/metrics.jsonl" ]] \
  && { echo "FAIL: a refused validation run started training"; failures=$((failures + 1)); } || echo "ok: refused validation runs wrote nothing"

# remat demo-quality: its own flags checked by range; the rest are the training run's options.
expect 2 "--seeds: Value 0 not in range" -- "$remat" demo-quality --seeds 0
expect 2 "cannot open config '$work/missing.json'" -- "$remat" demo-quality --config "$work/missing.json"
printf '{}\n' > "$work/empty_config.json"
expect 2 "unknown option 'frobnicate'" -- "$remat" demo-quality --config "$work/empty_config.json" --frobnicate=1

# remat sample --base_model_precision (issue 16): quantised while loading; refused names exit 2
# naming the value, before any model loads.
expect_quick 0 "wrote $work/q8.png" -- "$remat" sample "${sample[@]}" --prompt="a red square" --base_model_precision=int8-quanto --output="$work/q8.png"
expect_quick 0 "wrote $work/qnf4.png" -- "$remat" sample "${sample[@]}" --prompt="a red square" --base_model_precision=nf4-bnb --output="$work/qnf4.png"
expect_quick 2 "base_model_precision int4-quanto is not supported" -- "$remat" sample "${sample[@]}" --prompt=x --base_model_precision=int4-quanto --output="$work/badq.png"
[[ -e "$work/badq.png" ]] && { echo "FAIL: a PNG was written after a refused precision"; failures=$((failures + 1)); } || echo "ok: no PNG after a refused precision"

# remat ui: bad flags and a workspace that cannot be made exit 2; a second server on a busy port
# says so and exits 2 (the first is ended by its own pid).
expect 2 "--port: Value 70000 not in range" -- "$remat" ui --port 70000
touch "$work/not-a-dir"
expect 2 "--workspace must be a directory" -- "$remat" ui --port 18571 --workspace "$work/not-a-dir/ws"
ui_port=$((20000 + RANDOM % 20000))
"$remat" ui --port "$ui_port" --workspace "$work/ui-ws" > "$work/ui.out" 2>&1 &
ui_pid=$!
for _ in $(seq 50); do grep -q "remat ui: open" "$work/ui.out" && break; sleep 0.1; done
expect 2 "port $ui_port on 127.0.0.1 is already in use" -- "$remat" ui --port "$ui_port" --workspace "$work/ui-ws"
kill -INT "$ui_pid"
wait "$ui_pid" && echo "ok: remat ui stopped on SIGINT" || { echo "FAIL: remat ui did not exit 0 on SIGINT"; failures=$((failures + 1)); }

# base_model_precision in training (issue 16): a quantised base is for LoRA only, in train and bench.
expect 2 "base_model_precision=int8-quanto quantises the frozen base weights, which only LoRA training has" -- "$remat" train --model_type=full --base_model_precision=int8-quanto
expect 2 "pass --lora_rank > 0" -- "$remat" bench --base_model_precision=int8-quanto --steps 1

# Block swap (issue 33): the last blocks' frozen weights live in host memory and are streamed for
# each use. With every block checkpointed (the default) the run computes exactly what the run
# without it computes: the same loss at every step and the same LoRA, byte for byte.
"$remat" train "${tiny[@]}" --model_type=lora --seed=0 --output_dir="$work/swap-off" --max_train_steps=3 \
  --checkpointing_steps=0 > "$work/swap-off.log" 2>&1 || fail "a LoRA run without block swap"
"$remat" train "${tiny[@]}" --model_type=lora --seed=0 --musubi_blocks_to_swap=3 --output_dir="$work/swap-on" \
  --max_train_steps=3 --checkpointing_steps=0 > "$work/swap-on.log" 2>&1 || fail "a LoRA run with block swap"
grep -q "\[train\] block swap: the last 3 blocks' frozen weights" "$work/swap-on.log" \
  && echo "ok: block swap is logged" || fail "no block swap line in $work/swap-on.log"
losses() { grep -o 'step [0-9]*/[0-9]* loss [0-9.]*' "$1"; }
if [[ -n "$(losses "$work/swap-off.log")" && "$(losses "$work/swap-off.log")" == "$(losses "$work/swap-on.log")" ]] &&
   cmp -s "$work/swap-off/pytorch_lora_weights.safetensors" "$work/swap-on/pytorch_lora_weights.safetensors"; then
  echo "ok: block swap trains the same losses and the same LoRA"
else
  fail "block swap changed the losses:"; losses "$work/swap-off.log"; losses "$work/swap-on.log"
fi
expect 0 "(musubi_blocks_to_swap=9 clamped to the blocks less one, as SimpleTuner)" -- "$remat" train "${tiny[@]}" \
  --model_type=lora --musubi_blocks_to_swap=9 --output_dir="$work/swap-clamp" --max_train_steps=1 --checkpointing_steps=0
# A full fine-tune streams its trained weights both ways (gradients back to the host copies, the
# optimizer steps them there): the same losses and the same weights, byte for byte.
"$remat" train "${tiny[@]}" --model_type=full --seed=0 --output_dir="$work/full-off" --max_train_steps=3 \
  --checkpointing_steps=0 > "$work/full-off.log" 2>&1 || fail "a full fine-tune without block swap"
"$remat" train "${tiny[@]}" --model_type=full --seed=0 --musubi_blocks_to_swap=3 --output_dir="$work/full-on" \
  --max_train_steps=3 --checkpointing_steps=0 > "$work/full-on.log" 2>&1 || fail "a full fine-tune with block swap"
grep -q "\[train\] block swap: the last 3 blocks' weights, gradients and optimizer state" "$work/full-on.log" \
  && echo "ok: full fine-tune block swap is logged" || fail "no block swap line in $work/full-on.log"
full_weights() { find "$1" -name '*.safetensors' -path '*transformer*' | sort | head -1; }
if [[ -n "$(losses "$work/full-off.log")" && "$(losses "$work/full-off.log")" == "$(losses "$work/full-on.log")" ]] &&
   [[ -n "$(full_weights "$work/full-off")" ]] && cmp -s "$(full_weights "$work/full-off")" "$(full_weights "$work/full-on")"; then
  echo "ok: full fine-tune block swap trains the same losses and the same weights"
else
  fail "full fine-tune block swap changed the run:"; losses "$work/full-off.log"; losses "$work/full-on.log"
  ls -R "$work/full-off" | head -20
fi
# The same with the planner's layout (interval auto; streamed blocks one per checkpoint) and interval 2.
for ckpt in auto 2; do
  "$remat" train "${tiny[@]}" --model_type=full --seed=0 --musubi_blocks_to_swap=2 --gradient_checkpointing_interval=$ckpt \
    --gradient_checkpointing_memory_budget=1GiB --output_dir="$work/full-$ckpt" --max_train_steps=3 --checkpointing_steps=0 \
    > "$work/full-$ckpt.log" 2>&1 || fail "a full fine-tune with block swap and interval $ckpt"
  cmp -s "$(full_weights "$work/full-off")" "$(full_weights "$work/full-$ckpt")" \
    && echo "ok: full fine-tune, block swap, interval $ckpt: the same weights" \
    || fail "full fine-tune, block swap, interval $ckpt trained other weights"
done
# Attention offload (issue 33): every block's attention keeps its saved activations in host
# memory, with prefetch, a pool capped below the step's shapes and block swap; LoRA and full, a
# fixed interval and the planner's: the same LoRA and the same weights, byte for byte.
for run in "lora 2" "lora auto" "full 2" "full auto"; do
  read -r type ckpt <<< "$run"
  "$remat" train "${tiny[@]}" --model_type=$type --seed=0 --gradient_checkpointing_offload_attention=true \
    --gradient_checkpointing_offload_prefetch=true --gradient_checkpointing_offload_pin_memory_max_buckets=1 \
    --musubi_blocks_to_swap=2 --gradient_checkpointing_interval=$ckpt --gradient_checkpointing_memory_budget=1GiB \
    --output_dir="$work/attn-$type-$ckpt" --max_train_steps=3 --checkpointing_steps=0 \
    > "$work/attn-$type-$ckpt.log" 2>&1 || fail "a $type run with attention offload and interval $ckpt"
  if [[ $type == lora ]]; then
    want="$work/swap-off/pytorch_lora_weights.safetensors" got="$work/attn-$type-$ckpt/pytorch_lora_weights.safetensors"
  else
    want="$(full_weights "$work/full-off")" got="$(full_weights "$work/attn-$type-$ckpt")"
  fi
  grep -q "\[train\] attention offload: every block's attention keeps what it saves for backward in host memory, copied back one block ahead" \
    "$work/attn-$type-$ckpt.log" || fail "no attention offload line in $work/attn-$type-$ckpt.log"
  cmp -s "$want" "$got" && echo "ok: attention offload, $type, interval $ckpt: the same weights" \
    || fail "attention offload, $type, interval $ckpt trained other weights"
done
expect 2 "gradient_checkpointing_offload_pin_memory_max_buckets must be" -- "$remat" train --model_type=lora \
  --gradient_checkpointing_offload_pin_memory_max_buckets=-1
expect 0 "gradient_checkpointing_offload_prefetch=true has no effect because gradient_checkpointing_offload_attention is false" \
  -- "$remat" train "${tiny[@]}" --model_type=lora --gradient_checkpointing_offload_prefetch=true \
  --output_dir="$work/prefetch-alone" --max_train_steps=1 --checkpointing_steps=0
expect 2 "ema_device=accelerator would average them on the device" -- "$remat" train --model_type=full \
  --musubi_blocks_to_swap=2 --use_ema=true --ema_device=accelerator
expect 2 "musubi_block_swap_device must be one of cpu" -- "$remat" train --model_type=lora --musubi_blocks_to_swap=2 \
  --musubi_block_swap_device=cuda:0
expect 2 "musubi_blocks_to_swap must be" -- "$remat" train --model_type=lora --musubi_blocks_to_swap=-1

# remat plan (issue 33): checkpointing, offload and block swap for a budget from the options alone;
# the options it prints run as they are. flux-tiny at the demo data's shape: 64 px (16 image
# tokens), 8 text tokens.
plan=(--model_family flux --model_flavour flux-tiny --model_type lora --lora_rank 2 --resolution 64
      --tokenizer_max_length 8 --train_batch_size 2 --mixed_precision no --device cpu --num_threads 1)
expect 0 "predicted device peak:" -- "$remat" plan "${plan[@]}" --budget 1GiB
expect 0 "usage: remat plan" -- "$remat" plan --help
expect 2 "nothing fits in 1.00 KiB: the smallest predicted device peak is" -- "$remat" plan "${plan[@]}" --budget 1KiB
expect 2 "or quantise the base (base_model_precision int8-quanto or nf4-bnb)" -- "$remat" plan "${plan[@]}" --budget 1KiB
expect 2 "--budget is required" -- "$remat" plan "${plan[@]}"
expect 2 "--budget must be more than 0 bytes, got '0'" -- "$remat" plan "${plan[@]}" --budget 0
expect 2 "--budget must be a byte size" -- "$remat" plan "${plan[@]}" --budget lots
expect 2 "--device_tflops must be a number above 0, got 'fast'" -- "$remat" plan "${plan[@]}" --budget 1GiB --device_tflops fast
expect 2 "lora_rank must be" -- "$remat" plan "${plan[@]}" --lora_rank=0 --budget 1GiB
options=$("$remat" plan "${plan[@]}" --musubi_blocks_to_swap 2 --budget 1GiB 2>/dev/null | sed -n 's/^options: //p')
if [[ "$options" == *"--musubi_blocks_to_swap=2"* ]]; then
  # shellcheck disable=SC2086  # the options are separate words
  expect 0 "[train] block swap: the last 2 blocks" -- "$remat" train "${tiny[@]}" --model_type=lora --seed=0 $options \
    --output_dir="$work/planned" --max_train_steps=3 --checkpointing_steps=0
  # The planned layout and streaming change where bytes live, not what is computed.
  cmp -s "$work/swap-off/pytorch_lora_weights.safetensors" "$work/planned/pytorch_lora_weights.safetensors" \
    && echo "ok: the planned run ($options) trains the same LoRA as the plain one" \
    || fail "the planned run ($options) trained another LoRA than the plain one"
else
  fail "remat plan with musubi_blocks_to_swap 2 printed options '$options'"
fi

if ((failures)); then
  echo "$failures CLI checks failed"
  exit 1
fi
echo "all CLI checks passed"
