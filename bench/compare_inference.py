#!/usr/bin/env python3
"""remat vs diffusers / transformers on the same inference work: time, peak memory and agreement of the outputs.

Each case runs in fresh processes, alternating the two sides (remat first in even rounds, diffusers
first in odd ones, so drift in machine load hits both alike): remat through bench/inference_compare
(C++), diffusers through its own classes in this interpreter, on the same LibTorch (the PyTorch 2.x
build: `make bench TORCH=pytorch`, and diffusers installed into that build's venv). Both sides get
the same random weights (written once, in diffusers' layout), the same input and the same thread
count, and both count memory the same two ways: remat's tracking CPU allocator (for Python through
libremat_pytrack.so) and the resident set (VmHWM reset through /proc/self/clear_refs), each above the
start of the work, so weights and input are not counted. Both page in every file-backed mapping
(the libraries' code) before the start, so the resident set grows by what the work allocates,
not by the code it runs for the first time.

  build-pytorch/venv/bin/pip install diffusers accelerate transformers peft
  build-pytorch/venv/bin/python bench/compare_inference.py --build build-pytorch \\
      --cases vae-encode:256:fp32,clip:77:fp32,t5:512:bf16,lora-merge:16:fp32 --rounds 3 --markdown inference.md

A case is <work>:<size>:<fp32|bf16>. All weights are random.
  vae-encode, vae-decode      FLUX.1's VAE (diffusers' AutoencoderKL with FLUX.1-dev's vae/config.json);
                              size: the picture's side in pixels (decode: the latents of that picture)
  vae-encode-tiled,           the same with enable_tiling() and tiles of TILE_SAMPLE pixels (FLUX.1's own
  vae-decode-tiled            tiles are 1024 pixels, too large to tile on a CPU)
  clip                        CLIPTextModel with FLUX.1-dev's text_encoder/config.json (CLIP-L); size:
                              tokens (77 is FluxPipeline's); output: last_hidden_state and pooler_output
  t5                          T5EncoderModel at T5-v1.1-XXL's width (FLUX.1-dev's text_encoder_2) with
                              T5_BLOCKS of its 24 blocks; size: tokens (512 is FLUX.1-dev's limit)
  denoise, denoise-cfg        FluxPipeline's loop (output_type="latent", 4 steps, guidance 3.5, seed 0) on
                              a wide test transformer (WIDE_TRANSFORMER: FLUX.1's layout at a quarter of its
                              width, 2 + 4 blocks) with FLUX.1-dev's scheduler and random prompt
                              embeddings; size: the picture's side; denoise-cfg adds a negative prompt and
                              true CFG (true_cfg_scale 4)
  lora-merge                  a PEFT-format LoRA of rank `size` on every attention and feed-forward Linear
                              of the wide transformer, read and merged into its weights (diffusers:
                              load_lora_weights, fuse_lora, unload_lora_weights; needs peft); output:
                              the adapted weights, gathered after the measurement
"""

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

# FLUX.1-dev vae/config.json (black-forest-labs/FLUX.1-dev, diffusers format).
FLUX_VAE_CONFIG = dict(
    in_channels=3, out_channels=3, latent_channels=16, layers_per_block=2, norm_num_groups=32,
    block_out_channels=(128, 256, 512, 512), act_fn="silu", sample_size=1024,
    down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
    scaling_factor=0.3611, shift_factor=0.1159, use_quant_conv=False, use_post_quant_conv=False,
    mid_block_add_attention=True, force_upcast=True)


# A FLUX.1-shaped transformer small enough for a CPU: 2 double and 4 single blocks of width 768.
WIDE_TRANSFORMER = dict(
    patch_size=1, in_channels=64, num_layers=2, num_single_layers=4, attention_head_dim=128,
    num_attention_heads=6, joint_attention_dim=1024, pooled_projection_dim=768, guidance_embeds=True,
    axes_dims_rope=(16, 56, 56))
# FLUX.1-dev scheduler/scheduler_config.json.
FLUX_SCHEDULER_CONFIG = dict(
    num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15,
    base_image_seq_len=256, max_image_seq_len=4096)
DENOISE_STEPS = 4
TEXT_TOKENS = 128
# FLUX.1-dev text_encoder/config.json (CLIP-L's text tower).
CLIP_L_CONFIG = dict(
    hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
    max_position_embeddings=77, vocab_size=49408, hidden_act="quick_gelu", projection_dim=768,
    layer_norm_eps=1e-5, bos_token_id=0, eos_token_id=2, pad_token_id=1)
# FLUX.1-dev text_encoder_2/config.json (T5-v1.1-XXL's encoder), cut to T5_BLOCKS blocks: every block
# has the same shape, so time and memory per block are those of the full model.
T5_BLOCKS = 2
T5_XXL_CONFIG = dict(
    d_model=4096, d_kv=64, d_ff=10240, num_heads=64, num_layers=T5_BLOCKS, feed_forward_proj="gated-gelu",
    vocab_size=32128, relative_attention_num_buckets=32, relative_attention_max_distance=128,
    layer_norm_epsilon=1e-6, tie_word_embeddings=False)
# VAE tiles for the tiled cases: diffusers' tile_sample_min_size / tile_latent_min_size / tile_overlap_factor.
TILE_SAMPLE = 128
TILE_OVERLAP = 0.25
# The modules a lora-merge LoRA adapts: every Linear of the blocks' attention and feed-forward.
LORA_TARGETS = ("attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0", "attn.add_q_proj", "attn.add_k_proj",
                "attn.add_v_proj", "attn.to_add_out", "ff.net.0.proj", "ff.net.2", "ff_context.net.0.proj",
                "ff_context.net.2", "proj_mlp", "proj_out")
WORKS = ("vae-encode", "vae-decode", "vae-encode-tiled", "vae-decode-tiled", "clip", "t5", "denoise", "denoise-cfg",
         "lora-merge")


def status_bytes(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return -1


def page_in_mapped_files():
    """Reads every page of every readable file-backed mapping, as inference_compare.cpp's
    page_in_mapped_files does, so the first execution of library code is not counted as memory
    of the work."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) < 6 or not fields[1].startswith("r") or not fields[5].startswith("/") or fields[4] == "0":
                continue
            begin, end = (int(x, 16) for x in fields[0].split("-"))
            for page in range(begin, end, 4096):
                ctypes.string_at(page, 1)


def tile_geometry(work_dir):
    with open(os.path.join(work_dir, "case.json")) as f:
        return json.load(f)


def adapted_weights(named_modules, names):
    """The weights of the adapted Linear layers, flattened in the order of their sorted names."""
    import torch
    return torch.cat([named_modules[name].weight.detach().flatten() for name in sorted(names)])


def diffusers_case(work_dir, work, dtype, side):
    """Loads what `work` needs and returns the function that does it."""
    import torch
    from safetensors.torch import load_file
    input_path = os.path.join(work_dir, "input.safetensors")
    inputs = load_file(input_path) if os.path.exists(input_path) else {}
    if work.startswith("vae-"):
        from diffusers import AutoencoderKL
        vae = AutoencoderKL.from_pretrained(os.path.join(work_dir, "vae"), torch_dtype=dtype).eval()
        if work.endswith("-tiled"):
            vae.enable_tiling()
            geometry = tile_geometry(work_dir)
            vae.tile_sample_min_size = geometry["tile_sample_min_size"]
            vae.tile_latent_min_size = geometry["tile_latent_min_size"]
            vae.tile_overlap_factor = geometry["tile_overlap_factor"]
        x = inputs["input"].to(dtype)
        if work.startswith("vae-encode"):
            return lambda: vae.encode(x).latent_dist.mean
        return lambda: vae.decode(x).sample
    if work == "clip":
        from transformers import CLIPTextModel
        model = CLIPTextModel.from_pretrained(os.path.join(work_dir, "text_encoder"), dtype=dtype).eval()

        def run_clip():
            out = model(inputs["input_ids"], output_hidden_states=False)
            return torch.cat([out.last_hidden_state.flatten(), out.pooler_output.flatten()])
        return run_clip
    if work == "t5":
        from transformers import T5EncoderModel
        model = T5EncoderModel.from_pretrained(os.path.join(work_dir, "text_encoder_2"), dtype=dtype).eval()
        return lambda: model(inputs["input_ids"], output_hidden_states=False)[0]
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
    transformer = FluxTransformer2DModel.from_pretrained(os.path.join(work_dir, "transformer"), torch_dtype=dtype)
    if work == "lora-merge":
        pipe = FluxPipeline(scheduler=None, vae=None, text_encoder=None, tokenizer=None, text_encoder_2=None,
                            tokenizer_2=None, transformer=transformer.eval())
        names = lora_module_names(transformer)

        def run_merge():
            pipe.load_lora_weights(os.path.join(work_dir, "lora.safetensors"))
            pipe.fuse_lora()
            pipe.unload_lora_weights()
            return lambda: adapted_weights(dict(transformer.named_modules()), names)
        return run_merge
    scheduler = FlowMatchEulerDiscreteScheduler.from_pretrained(os.path.join(work_dir, "scheduler"))
    pipe = FluxPipeline(scheduler=scheduler, vae=None, text_encoder=None, tokenizer=None, text_encoder_2=None,
                        tokenizer_2=None, transformer=transformer.eval())
    pipe.set_progress_bar_config(disable=True)
    embeds = {k: v.to(dtype)[None] for k, v in inputs.items()}
    if work != "denoise-cfg":
        embeds = {k: v for k, v in embeds.items() if not k.startswith("negative_")}

    def run():
        latents = pipe(**embeds, height=side, width=side, num_inference_steps=DENOISE_STEPS, guidance_scale=3.5,
                       true_cfg_scale=4.0, generator=torch.Generator().manual_seed(0), output_type="latent").images
        return FluxPipeline._unpack_latents(latents, side, side, 8)[0]
    return run


def lora_module_names(transformer):
    """The Linear layers a lora-merge LoRA adapts, in the transformer's module order."""
    return [name for name, _ in transformer.named_modules()
            if any(name.endswith("." + target) for target in LORA_TARGETS)]


def run_diffusers(work_dir, work, dtype_name, side, threads, pytrack):
    """The diffusers side of one case, in this (fresh) process; prints one JSON line."""
    track = ctypes.CDLL(pytrack)
    track.remat_current_bytes.restype = ctypes.c_int64
    track.remat_peak_bytes.restype = ctypes.c_int64
    if track.remat_install_cpu_tracking() != 1:
        raise SystemExit("remat's tracking allocator could not be installed in this process")
    import torch
    from safetensors.torch import save_file
    torch.set_num_threads(threads)
    dtype = torch.bfloat16 if dtype_name == "bf16" else torch.float32
    run = diffusers_case(work_dir, work, dtype, side)
    with torch.no_grad():
        page_in_mapped_files()
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        rss_start = status_bytes("VmRSS")
        anon_start, file_start = status_bytes("RssAnon"), status_bytes("RssFile")
        track.remat_reset_peak()
        start_bytes = track.remat_current_bytes()
        start = time.perf_counter()
        out = run()
        seconds = time.perf_counter() - start
        tracked = track.remat_peak_bytes() - start_bytes
        rss = status_bytes("VmHWM") - rss_start
        rss_anon, rss_file = status_bytes("RssAnon") - anon_start, status_bytes("RssFile") - file_start
        if callable(out):  # a work whose result is the model itself: gathered after the measurement
            out = out()
    save_file({"output": out.float().contiguous()}, os.path.join(work_dir, "output_diffusers.safetensors"))
    print(json.dumps({"seconds": seconds, "tracked_peak": tracked, "rss_peak": rss, "rss_anon": rss_anon,
                      "rss_file": rss_file}))


def prepare(work_dir, work, size, seed=0):
    """Random weights and inputs for `work`, in diffusers' (transformers') layout."""
    import torch
    from safetensors.torch import save_file
    torch.manual_seed(seed)
    if work in ("clip", "t5"):
        from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel
        if work == "clip":
            model, folder = CLIPTextModel(CLIPTextConfig(**CLIP_L_CONFIG)), "text_encoder"
        else:
            model, folder = T5EncoderModel(T5Config(**T5_XXL_CONFIG)), "text_encoder_2"
        model.save_pretrained(os.path.join(work_dir, folder))
        if work == "clip":
            # Framed as CLIP's tokenizer frames a caption: <|startoftext|>, words, <|endoftext|> padded
            # to the end (the legacy pooled rule of eos_token_id 2 takes the first 49407).
            ids = torch.randint(0, 49406, (1, size))
            ids[0, 0], ids[0, size // 2:] = 49406, 49407
        else:
            ids = torch.randint(0, model.config.vocab_size, (1, size))
        save_file({"input_ids": ids}, os.path.join(work_dir, "input.safetensors"))
        return
    if work.startswith("denoise") or work == "lora-merge":
        from diffusers import FlowMatchEulerDiscreteScheduler, FluxTransformer2DModel
        transformer = FluxTransformer2DModel(**WIDE_TRANSFORMER)
        transformer.save_pretrained(os.path.join(work_dir, "transformer"))
        if work == "lora-merge":
            lora = {}
            modules = dict(transformer.named_modules())
            for name in lora_module_names(transformer):
                linear = modules[name]
                lora["transformer.%s.lora_A.weight" % name] = torch.randn(size, linear.in_features) / linear.in_features
                lora["transformer.%s.lora_B.weight" % name] = torch.randn(linear.out_features, size) / size
            save_file(lora, os.path.join(work_dir, "lora.safetensors"))
            return
        FlowMatchEulerDiscreteScheduler(**FLUX_SCHEDULER_CONFIG).save_pretrained(os.path.join(work_dir, "scheduler"))
        embeds = {}
        for prefix in ("", "negative_"):
            embeds[prefix + "prompt_embeds"] = torch.randn(TEXT_TOKENS, WIDE_TRANSFORMER["joint_attention_dim"])
            embeds[prefix + "pooled_prompt_embeds"] = torch.randn(WIDE_TRANSFORMER["pooled_projection_dim"])
        save_file(embeds, os.path.join(work_dir, "input.safetensors"))
        return
    from diffusers import AutoencoderKL
    AutoencoderKL(**FLUX_VAE_CONFIG).save_pretrained(os.path.join(work_dir, "vae"), safe_serialization=True)
    downsampling = 2 ** (len(FLUX_VAE_CONFIG["block_out_channels"]) - 1)
    if work.endswith("-tiled"):
        with open(os.path.join(work_dir, "case.json"), "w") as f:
            json.dump({"tile_sample_min_size": TILE_SAMPLE, "tile_latent_min_size": TILE_SAMPLE // downsampling,
                       "tile_overlap_factor": TILE_OVERLAP}, f)
    if work.startswith("vae-encode"):
        x = torch.rand(1, 3, size, size) * 2 - 1
    else:
        x = torch.randn(1, FLUX_VAE_CONFIG["latent_channels"], size // downsampling, size // downsampling)
    save_file({"input": x.contiguous()}, os.path.join(work_dir, "input.safetensors"))


def one_run(command):
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit("failed: %s\n%s%s" % (" ".join(command), done.stdout, done.stderr))
    return json.loads(done.stdout.strip().splitlines()[-1])


def agreement(work_dir):
    import torch
    from safetensors.torch import load_file
    a = load_file(os.path.join(work_dir, "output_remat.safetensors"))["output"].double()
    b = load_file(os.path.join(work_dir, "output_diffusers.safetensors"))["output"].double()
    if a.shape != b.shape:
        raise SystemExit("output shapes differ: remat %s, diffusers %s" % (list(a.shape), list(b.shape)))
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-300)).item()


def mib(count):
    return "%.1f MiB" % (count / 2**20)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default="build-pytorch", help="remat build folder with bench programs")
    parser.add_argument("--cases", default="vae-encode:256:fp32,vae-encode:512:fp32,vae-decode:256:fp32,"
                                           "vae-decode:512:fp32,vae-encode-tiled:256:fp32,vae-decode-tiled:192:fp32,"
                                           "clip:77:fp32,t5:512:fp32,denoise:256:fp32,denoise-cfg:256:fp32,"
                                           "lora-merge:16:fp32")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--markdown", help="also write the table to this file")
    parser.add_argument("--worker", nargs=5, metavar=("DIR", "WORK", "DTYPE", "SIDE", "PYTRACK"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        run_diffusers(args.worker[0], args.worker[1], args.worker[2], int(args.worker[3]), args.threads,
                      args.worker[4])
        return
    remat_bin = os.path.join(args.build, "bench", "inference_compare")
    pytrack = os.path.abspath(os.path.join(args.build, "bench", "libremat_pytrack.so"))
    for path in (remat_bin, pytrack):
        if not os.path.exists(path):
            raise SystemExit("%s is missing: build the benchmarks (make bench TORCH=pytorch)" % path)
    rows = []
    with tempfile.TemporaryDirectory() as root:
        for case in args.cases.split(","):
            work, side, dtype = case.split(":")
            if work not in WORKS or dtype not in ("fp32", "bf16") or not side.isdigit():
                raise SystemExit("a case is <%s>:<size>:<fp32|bf16>, got %r" % ("|".join(WORKS), case))
            work_dir = os.path.join(root, case.replace(":", "-"))
            os.makedirs(work_dir)
            prepare(work_dir, work, int(side))
            remat_cmd = [remat_bin, work_dir, work, dtype, str(args.threads)]
            if work.startswith("denoise"):
                remat_cmd += [side, str(DENOISE_STEPS)]

            py_cmd = [sys.executable, os.path.abspath(__file__), "--threads", str(args.threads),
                      "--worker", work_dir, work, dtype, side, pytrack]
            runs = {"remat": [], "diffusers": []}
            for r in range(args.rounds):
                order = [("remat", remat_cmd), ("diffusers", py_cmd)]
                for name, cmd in (order if r % 2 == 0 else order[::-1]):
                    runs[name].append(one_run(cmd))
            med = {side_name: {k: statistics.median(x[k] for x in v) for k in ("seconds", "tracked_peak", "rss_peak")}
                   for side_name, v in runs.items()}
            # Both sides of a round ran back to back, so their ratio sees one machine load: the
            # spread of these ratios is the noise of the median's.
            paired = sorted(a["seconds"] / b["seconds"] for a, b in zip(runs["remat"], runs["diffusers"]))
            rows.append((case, med, agreement(work_dir), paired))
            print(case, json.dumps(dict(med, paired_time_ratios=paired)), flush=True)
    lines = ["| work | remat time | upstream time | time ratio | per-round ratios | remat peak (tracked / RSS) | "
             "upstream peak (tracked / RSS) | peak ratio (tracked / RSS) | max rel. difference |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for case, m, diff, paired in rows:
        r, d = m["remat"], m["diffusers"]
        lines.append("| %s | %.3f s | %.3f s | %.2f | %.2f-%.2f | %s / %s | %s / %s | %.2f / %.2f | %.1e |" % (
            case, r["seconds"], d["seconds"], r["seconds"] / d["seconds"], paired[0], paired[-1],
            mib(r["tracked_peak"]), mib(r["rss_peak"]), mib(d["tracked_peak"]), mib(d["rss_peak"]),
            r["tracked_peak"] / d["tracked_peak"], r["rss_peak"] / max(d["rss_peak"], 1), diff))
    table = "\n".join(lines)
    print(table)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write("%d rounds, medians; %d thread(s)\n\n%s\n" % (args.rounds, args.threads, table))


if __name__ == "__main__":
    main()
