#!/usr/bin/env bash
# Hostile input to the surfaces added since the first hardening pass (picture folders and their
# names, multidatabackend.json, pipeline folders and their configs, tokenizer files, `remat sample`,
# checkpoints): every case exits 2 with a message naming the file or value, prints no raw library
# text, and writes nothing wrong with exit 0. Usage: hostile_input_test.sh <remat binary>
set -u
remat=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/expect.sh"
expect_quick() { local code=$1 text=$2; shift 3; expect "$code" "$text" -- timeout 120 "$@"; }
# No case may answer with a library's own words.
raw_text='json.exception|filesystem error|std::bad_alloc|DefaultCPUAllocator|max_size\(\)'
expect_clean() {
  local code=$1 text=$2
  shift 3
  local out status
  out=$(timeout 120 "$@" 2>&1)
  status=$?
  if [[ $status -ne $code || "$out" != *"$text"* ]] || grep -qE "$raw_text" <<< "$out"; then
    fail "'$*' exited $status (want $code), output:"
    echo "$out" | tail -5
    echo "  (wanted it to contain: $text, and no raw library text)"
  else
    echo "ok: $* -> $status"
  fi
}
check() {  # check <description> <command...>: the command must succeed
  local what=$1
  shift
  if "$@"; then echo "ok: $what"; else fail "$what"; fi
}

"$remat" make-demo-pipeline --output "$work/pipe" > /dev/null || fail "make-demo-pipeline"
python3 "$(dirname "$0")/two_squares.py" "$work/pics"
images=(--pretrained_model_name_or_path="$work/pipe" --resolution=32 --resolution_type=pixel --mixed_precision=no)
pipeline=(--pipeline="$work/pipe" --num_inference_steps=1 --dtype=float32)
sample=("${pipeline[@]}" --width=32 --height=32)
# A multidatabackend.json: one picture dataset (extra keys as JSON text) and one text cache.
backends() {  # backends <file> <picture dir> <vae cache> <text cache> [extra keys]
  printf '[{"id": "d", "type": "local", "instance_data_dir": "%s", "cache_dir_vae": "%s", "resolution": 32, "resolution_type": "pixel"%s},
           {"id": "t", "type": "local", "dataset_type": "text_embeds", "default": true, "cache_dir": "%s"}]\n' \
    "$2" "$3" "${5:-}" "$4" > "$1"
}

# ---- 1. Library text, exit 1, before ----
# A picture whose name is not UTF-8 is skipped, named (\xFF); a folder whose name is not is refused.
mkdir -p "$work/p1" && cp "$work"/pics/*.png "$work/p1/" && cp "$work/pics/a red square.png" "$work/p1/$(printf 'bad\xff.png')"
expect_clean 0 "bad\\xFF.png: the file name is not valid UTF-8" -- "$remat" cache "${images[@]}" --instance_data_dir="$work/p1" --cache_dir="$work/c1"
bad_dir="$work/$(printf 'dir\xff')"
mkdir -p "$bad_dir" && cp "$work"/pics/*.png "$bad_dir/"
expect_clean 2 "instance_data_dir '$work/dir\\xFF' is not valid UTF-8" -- "$remat" cache "${images[@]}" --instance_data_dir="$bad_dir" --cache_dir="$work/c2"
expect_clean 2 "is not valid UTF-8" -- "$remat" train "${images[@]}" --instance_data_dir="$bad_dir" --cache_dir="$work/c2" --output_dir="$work/o2" --max_train_steps=1
# A garbage merges.txt is named.
cp -r "$work/pipe" "$work/pipe-merges" && printf '\xff\xfe garbage\n' > "$work/pipe-merges/tokenizer/merges.txt"
expect_clean 2 "tokenizer file '$work/pipe-merges/tokenizer/merges.txt' line 1" -- "$remat" encode --pretrained_model_name_or_path="$work/pipe-merges" --caption=boat
# Cache folders that are files, or lie under one.
touch "$work/a-file"
backends "$work/vae-file.json" "$work/pics" "$work/a-file/sub" "$work/tc"
expect_clean 2 "cache_dir_vae '$work/a-file/sub' cannot be created: '$work/a-file' is a file, not a directory" -- "$remat" cache --pretrained_model_name_or_path="$work/pipe" --data_backend_config="$work/vae-file.json" --mixed_precision=no
backends "$work/text-file.json" "$work/pics" "$work/vc" "$work/a-file"
expect_clean 2 "cache_dir '$work/a-file' cannot be created: '$work/a-file' is a file, not a directory" -- "$remat" cache --pretrained_model_name_or_path="$work/pipe" --data_backend_config="$work/text-file.json" --mixed_precision=no
# Counts: repeats, steps.
backends "$work/repeats.json" "$work/pics" "$work/vc3" "$work/tc3" ', "repeats": 1e18'
expect_clean 2 "repeats = 1e+18: must be 0 or more and at most 1000000" -- "$remat" train --pretrained_model_name_or_path="$work/pipe" --data_backend_config="$work/repeats.json" --mixed_precision=no --output_dir="$work/o3" --max_train_steps=1
expect_clean 2 "Value 1000000000 not in range 1 to 10000" -- "$remat" sample "${sample[@]}" --prompt=x --num_inference_steps=1000000000 --output="$work/s.png"
expect_clean 2 "Value 99999999999999999999 not in range 1 to 10000" -- "$remat" sample "${sample[@]}" --prompt=x --num_inference_steps=99999999999999999999 --output="$work/s.png"

# ---- 2. Sizes from configs and flags: bounded before anything is allocated ----
edit_json() {  # edit_json <file> <python statement on c>
  python3 -c "import json, sys; p = sys.argv[1]; c = json.load(open(p)); $2; json.dump(c, open(p, 'w'))" "$1"
}
cp -r "$work/pipe" "$work/pipe-vae-layers" && edit_json "$work/pipe-vae-layers/vae/config.json" "c['layers_per_block'] = 100000"
expect_clean 2 "vae/config.json: layers_per_block must be in [1, 16], got 100000" -- "$remat" encode --pretrained_model_name_or_path="$work/pipe-vae-layers" --image="$work/pics/a red square.png"
cp -r "$work/pipe" "$work/pipe-t5-layers" && edit_json "$work/pipe-t5-layers/text_encoder_2/config.json" "c['num_layers'] = 100000"
expect_clean 2 "text_encoder_2/config.json': num_layers must be at most 128" -- "$remat" encode --pretrained_model_name_or_path="$work/pipe-t5-layers" --caption=boat
cp -r "$work/pipe" "$work/pipe-vae-width" && edit_json "$work/pipe-vae-width/vae/config.json" "c['block_out_channels'][0] = 10**9"
expect_clean 2 "vae/config.json: every block_out_channels entry must be at most 4096" -- "$remat" encode --pretrained_model_name_or_path="$work/pipe-vae-width" --image="$work/pics/a red square.png"
expect_clean 2 "width must be at most 8192 pixels, got 16384" -- "$remat" sample "${pipeline[@]}" --prompt=x --width=16384 --height=32 --output="$work/s.png"
expect_clean 2 "width must be at most 8192 pixels, got 100000" -- "$remat" sample "${pipeline[@]}" --prompt=x --width=100000 --height=32 --output="$work/s.png"
# Within the bounds but past any machine's memory (the demo VAE's mid-block attention at 8192 px
# spans 4096 x 4096 latent pixels: over 100 GiB of scores per query chunk): refused by the memory
# model with both figures, before any model loads. Out of memory while caching was reported as
# unreadable pictures before.
expect_clean 2 "[memory] decoding a 8192 x 8192 picture needs about" -- "$remat" sample "${pipeline[@]}" --prompt=x --width=8192 --height=8192 --vae_tiling_above=100000 --output="$work/s.png"
expect_clean 2 "[memory] caching VAE latents: encoding a 8192 x 8192 picture" -- "$remat" cache "${images[@]}" --resolution=8192 --instance_data_dir="$work/pics" --cache_dir="$work/c8192"
[[ ! -e "$work/s.png" ]] && echo "ok: no PNG after a refused size" || fail "a PNG was written after a refused size"

# ---- 3. Wrong output with exit 0, before ----
# One cache folder spelled three ways (x/., a/../x, a symlink) is one folder.
mkdir -p "$work/x" "$work/a" && ln -s "$work/x" "$work/x-link"
for spelling in "$work/x/." "$work/a/../x" "$work/x-link"; do
  printf '[{"id": "one", "type": "local", "instance_data_dir": "%s", "cache_dir_vae": "%s/x", "resolution": 32, "resolution_type": "pixel"},
           {"id": "two", "type": "local", "instance_data_dir": "%s", "cache_dir_vae": "%s", "resolution": 32, "resolution_type": "pixel"},
           {"id": "t", "type": "local", "dataset_type": "text_embeds", "default": true, "cache_dir": "%s/tc-alias"}]\n' \
    "$work/pics" "$work" "$work/p1" "$spelling" "$work" > "$work/alias.json"
  expect_clean 2 "backend 'two': cache_dir_vae = \"$spelling\" is also the VAE cache of backend 'one' (both are '$work/x')" -- "$remat" cache --pretrained_model_name_or_path="$work/pipe" --data_backend_config="$work/alias.json" --mixed_precision=no
done
expect_clean 2 "resolution = 1e+308: must be at most 8192 pixels" -- "$remat" cache "${images[@]}" --resolution=1e308 --instance_data_dir="$work/pics" --cache_dir="$work/c5"
expect_clean 2 "resolution = 1e+20: must be at most 8192 pixels" -- "$remat" cache "${images[@]}" --resolution=1e20 --instance_data_dir="$work/pics" --cache_dir="$work/c6"
expect_clean 2 "resolution = 100.0: must be at most 64 megapixels" -- "$remat" cache "${images[@]}" --resolution=100 --resolution_type=area --instance_data_dir="$work/pics" --cache_dir="$work/c7"

# NaN and inf: a LoRA, a pipeline's weights, a checkpoint to resume, a run whose loss diverges.
python3 - "$work" <<'PY'
import json, struct, sys
def save(path, tensors):
    header, blob = {}, b""
    for key, (shape, values) in tensors.items():
        header[key] = {"dtype": "F32", "shape": shape, "data_offsets": [len(blob), len(blob) + 4 * len(values)]}
        blob += struct.pack("<%df" % len(values), *values)
    text = json.dumps(header).encode()
    open(path, "wb").write(struct.pack("<Q", len(text)) + text + blob)
nan = float("nan")
save(sys.argv[1] + "/nan_lora.safetensors", {
    "transformer.transformer_blocks.0.attn.to_q.lora_A.weight": ([2, 64], [0.01] * 127 + [nan]),
    "transformer.transformer_blocks.0.attn.to_q.lora_B.weight": ([64, 2], [0.01] * 128)})
PY
expect_clean 2 "tensor 'transformer.transformer_blocks.0.attn.to_q.lora_A.weight' holds 1 non-finite value(s)" -- "$remat" sample "${sample[@]}" --prompt=x --lora="$work/nan_lora.safetensors" --output="$work/nan.png"
# poison <safetensors file> <tensor name>: its first element becomes +inf (the bytes, in place).
poison() {
  python3 - "$1" "$2" <<'PY'
import json, struct, sys
path, name = sys.argv[1:3]
raw = bytearray(open(path, "rb").read())
n = struct.unpack("<Q", raw[:8])[0]
entry = json.loads(raw[8:8 + n])[name]
assert entry["dtype"] in ("F32", "BF16"), entry["dtype"]
at = 8 + n + entry["data_offsets"][0]
raw[at:at + 4] = struct.pack("<f", float("inf")) if entry["dtype"] == "F32" else b"\x80\x7f\x80\x7f"
open(path, "wb").write(raw)
PY
}
cp -r "$work/pipe" "$work/pipe-inf"
shard=$(ls "$work/pipe-inf/transformer/"*.safetensors | head -1)
poison "$shard" "$(python3 -c "import json, struct, sys; f = open(sys.argv[1], 'rb'); n = struct.unpack('<Q', f.read(8))[0]; print(sorted(k for k in json.loads(f.read(n)) if k.endswith('.weight'))[0])" "$shard")"
expect_clean 2 "non-finite value(s) (NaN or inf)" -- "$remat" sample --pipeline="$work/pipe-inf" --width=32 --height=32 --num_inference_steps=1 --dtype=float32 --prompt=x --output="$work/inf.png"
ls "$work"/nan*.png "$work"/inf*.png > /dev/null 2>&1 && fail "a PNG was written from non-finite weights" || echo "ok: no PNG from non-finite weights"

"$remat" make-demo-data --output "$work/data" --samples 4 --size 8 --text_tokens 8 --joint_dim 32 --pooled_dim 16 > /dev/null || fail "make-demo-data"
tiny=(--model_family=flux --model_flavour=flux-tiny --instance_data_dir="$work/data" --train_batch_size=2
      --mixed_precision=no --model_type=lora --lora_rank=2 --report_every=1 --num_threads=1)
# A run whose loss turns non-finite (here its data does, after two good steps and checkpoints)
# stops at that step with exit 2 naming it: no checkpoint or weights written after it, and the
# last checkpoint holds finite weights.
"$remat" make-demo-data --output "$work/data-diverge" --samples 4 --size 8 --text_tokens 8 --joint_dim 32 --pooled_dim 16 > /dev/null || fail "make-demo-data"
"$remat" train "${tiny[@]}" --instance_data_dir="$work/data-diverge" --output_dir="$work/diverge" --max_train_steps=2 --checkpointing_steps=1 > /dev/null 2>&1 || fail "two good steps"
weights_before=$(sha256sum < "$work/diverge/pytorch_lora_weights.safetensors")
for sample_file in "$work"/data-diverge/*.safetensors; do poison "$sample_file" latents; done
out=$(timeout 300 "$remat" train "${tiny[@]}" --instance_data_dir="$work/data-diverge" --output_dir="$work/diverge" \
      --max_train_steps=6 --checkpointing_steps=1 --resume_from_checkpoint=latest 2>&1)
status=$?
last=$(ls -d "$work"/diverge/checkpoint-* 2>/dev/null | sed 's/.*checkpoint-//' | sort -n | tail -1)
if [[ $status -eq 2 && "$out" == *"[train] step 3: the loss is NaN"* && "$out" == *"the last checkpoint, $work/diverge/checkpoint-2, holds finite weights"* ]] \
   && ! grep -qE "$raw_text" <<< "$out" && [[ "$last" == 2 && "$(sha256sum < "$work/diverge/pytorch_lora_weights.safetensors")" == "$weights_before" ]]; then
  echo "ok: the loss went non-finite at step 3: exit 2, checkpoint-2 the last, the weights file untouched"
else
  fail "diverging run: exit $status, last checkpoint '${last}'"
  echo "$out" | tail -4
fi
check "checkpoint-2 holds finite weights" python3 - "$work/diverge/checkpoint-2/trainable.safetensors" <<'PY'
import json, math, struct, sys
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
for name, e in json.loads(raw[8:8 + n]).items():
    if name == "__metadata__" or e["dtype"] != "F32": continue
    b, f = e["data_offsets"]
    values = struct.unpack("<%df" % ((f - b) // 4), raw[8 + n + b:8 + n + f])
    assert all(math.isfinite(v) for v in values), name
PY
# Resuming a checkpoint whose weights hold inf names the tensor.
"$remat" train "${tiny[@]}" --output_dir="$work/resume" --max_train_steps=1 > /dev/null 2>&1 || fail "a one-step run"
checkpoint="$work/resume/checkpoint-1/trainable.safetensors"
poison "$checkpoint" "$(python3 -c "import json, struct, sys; f = open(sys.argv[1], 'rb'); n = struct.unpack('<Q', f.read(8))[0]; print(sorted(k for k in json.loads(f.read(n)) if k != '__metadata__')[0])" "$checkpoint")"
expect_clean 2 "checkpoint-1/trainable.safetensors': tensor '" -- "$remat" train "${tiny[@]}" --output_dir="$work/resume" --max_train_steps=2 --resume_from_checkpoint=latest

# ---- 4. Messages that name the file ----
# Bad caption files skip their picture, named, as docs/YOUR_DATA.md says; the rest trains.
mkdir -p "$work/captions" && cp "$work"/pics/*.png "$work/captions/" && cp "$work/pics/a red square.png" "$work/captions/good.png"
python3 -c "import sys; open(sys.argv[1], 'w').write('x' * 20000)" "$work/captions/a red square.txt"
printf 'a \xff caption' > "$work/captions/a blue square.txt"
printf 'a fine caption' > "$work/captions/good.txt"
expect_clean 0 "caption file $work/captions/a red square.txt holds a caption of 20000 bytes" -- "$remat" cache "${images[@]}" --caption_strategy=textfile --instance_data_dir="$work/captions" --cache_dir="$work/c8"
expect_clean 0 "caption file $work/captions/a blue square.txt is not valid UTF-8" -- "$remat" cache "${images[@]}" --caption_strategy=textfile --instance_data_dir="$work/captions" --cache_dir="$work/c9"
cp -r "$work/pipe" "$work/pipe-transformer-config" && echo 'not json' > "$work/pipe-transformer-config/transformer/config.json"
expect_clean 2 "'$work/pipe-transformer-config/transformer/config.json': malformed config JSON" -- "$remat" sample --pipeline="$work/pipe-transformer-config" --prompt=x --width=32 --height=32 --output="$work/s.png"
cp -r "$work/pipe" "$work/pipe-scheduler-config" && echo 'not json' > "$work/pipe-scheduler-config/scheduler/scheduler_config.json"
expect_clean 2 "'$work/pipe-scheduler-config/scheduler/scheduler_config.json': malformed config JSON" -- "$remat" sample --pipeline="$work/pipe-scheduler-config" --prompt=x --width=32 --height=32 --output="$work/s.png"
printf 'a red square\n\xff\xfe not UTF-8\n' > "$work/bad-prompts.txt"
expect_clean 2 "--prompt_file '$work/bad-prompts.txt' line 2 is not valid UTF-8" -- "$remat" sample "${sample[@]}" --prompt_file="$work/bad-prompts.txt" --output="$work/bp.png"

# ---- 6. Interrupted writes ----
# A sample write killed before its rename leaves .<name>.tmp.XXXXXX: the next run removes it.
printf 'partial' > "$work/.s6.png.tmp.AbC123"
expect_clean 0 "removed $work/.s6.png.tmp.AbC123" -- "$remat" sample "${sample[@]}" --prompt=x --output="$work/s6.png"
[[ ! -e "$work/.s6.png.tmp.AbC123" && -f "$work/s6.png" ]] && echo "ok: stale sample temporary removed" || fail "stale sample temporary left"
# Checkpoint rotation moves an old checkpoint aside before deleting it; what a kill leaves there
# is removed by the next run, and every checkpoint-N left is complete.
"$remat" train "${tiny[@]}" --output_dir="$work/rotate" --max_train_steps=4 --checkpointing_steps=1 --checkpoints_total_limit=2 > /dev/null 2>&1 || fail "rotation run"
mkdir -p "$work/rotate/.tmp-checkpoint-pruned-checkpoint-1" && touch "$work/rotate/.tmp-checkpoint-pruned-checkpoint-1/state.json"
"$remat" train "${tiny[@]}" --output_dir="$work/rotate" --max_train_steps=5 --checkpointing_steps=1 --checkpoints_total_limit=2 --resume_from_checkpoint=latest > /dev/null 2>&1 || fail "resumed rotation run"
left=$(ls -A "$work/rotate" | grep -E '^(checkpoint|\.tmp)' | tr '\n' ' ')
complete=1
for dir in "$work"/rotate/checkpoint-*; do
  for file in state.json trainable.safetensors optimizer.safetensors rng.safetensors; do [[ -f "$dir/$file" ]] || complete=0; done
done
[[ "$left" == "checkpoint-4 checkpoint-5 " && $complete -eq 1 ]] && echo "ok: rotation kept checkpoint-4 and -5, complete; the leftover was removed" \
  || fail "rotation left: $left (complete: $complete)"

if ((failures)); then
  echo "$failures hostile-input checks failed"
  exit 1
fi
echo "all hostile-input checks passed"
