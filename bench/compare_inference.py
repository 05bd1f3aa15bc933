#!/usr/bin/env python3
"""remat vs diffusers on the same inference work: time, peak memory and agreement of the outputs.

Each case runs in fresh processes, alternating the two sides (remat first in even rounds, diffusers
first in odd ones, so drift in machine load hits both alike): remat through bench/inference_compare
(C++), diffusers through its own classes in this interpreter, on the same LibTorch (the PyTorch 2.x
build: `make bench TORCH=pytorch`, and diffusers installed into that build's venv). Both sides get
the same random weights (written once, in diffusers' layout), the same input and the same thread
count, and both count memory the same two ways: remat's tracking CPU allocator (for Python through
libremat_pytrack.so) and the resident set (VmHWM reset through /proc/self/clear_refs), each above the
start of the work, so weights and input are not counted.

  build-pytorch/venv/bin/pip install diffusers accelerate
  build-pytorch/venv/bin/python bench/compare_inference.py --build build-pytorch \\
      --cases vae-encode:256:fp32,vae-encode:512:fp32,vae-encode:512:bf16,vae-decode:256:fp32,vae-decode:512:fp32 \\
      --rounds 3 --markdown inference.md

A case is <vae-encode|vae-decode|denoise|denoise-cfg>:<image side in pixels>:<fp32|bf16>. The VAE is FLUX.1's
(diffusers' AutoencoderKL with FLUX.1-dev's vae/config.json); `denoise` is FluxPipeline's loop
(output_type="latent", 4 steps, guidance 3.5, seed 0) on a wide test transformer (WIDE_TRANSFORMER:
FLUX.1's layout at a quarter of its width, 2 + 4 blocks) with FLUX.1-dev's scheduler and random
prompt embeddings; `denoise-cfg` adds a negative prompt and true CFG (true_cfg_scale 4). All weights
are random.
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


def status_bytes(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return -1


def diffusers_case(work_dir, work, dtype, side):
    """Loads what `work` needs and returns the function that does it."""
    import torch
    from safetensors.torch import load_file
    inputs = load_file(os.path.join(work_dir, "input.safetensors"))
    if work.startswith("vae-"):
        from diffusers import AutoencoderKL
        vae = AutoencoderKL.from_pretrained(os.path.join(work_dir, "vae"), torch_dtype=dtype).eval()
        x = inputs["input"].to(dtype)
        if work == "vae-encode":
            return lambda: vae.encode(x).latent_dist.mean
        return lambda: vae.decode(x).sample
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
    transformer = FluxTransformer2DModel.from_pretrained(os.path.join(work_dir, "transformer"), torch_dtype=dtype)
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
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        rss_start = status_bytes("VmRSS")
        track.remat_reset_peak()
        start_bytes = track.remat_current_bytes()
        start = time.perf_counter()
        out = run()
        seconds = time.perf_counter() - start
        tracked = track.remat_peak_bytes() - start_bytes
        rss = status_bytes("VmHWM") - rss_start
    save_file({"output": out.float().contiguous()}, os.path.join(work_dir, "output_diffusers.safetensors"))
    print(json.dumps({"seconds": seconds, "tracked_peak": tracked, "rss_peak": rss}))


def prepare(work_dir, work, side, seed=0):
    """Random weights and inputs for `work`, in diffusers' layout."""
    import torch
    from safetensors.torch import save_file
    torch.manual_seed(seed)
    if work.startswith("denoise"):
        from diffusers import FlowMatchEulerDiscreteScheduler, FluxTransformer2DModel
        FluxTransformer2DModel(**WIDE_TRANSFORMER).save_pretrained(os.path.join(work_dir, "transformer"))
        FlowMatchEulerDiscreteScheduler(**FLUX_SCHEDULER_CONFIG).save_pretrained(os.path.join(work_dir, "scheduler"))
        embeds = {}
        for prefix in ("", "negative_"):
            embeds[prefix + "prompt_embeds"] = torch.randn(TEXT_TOKENS, WIDE_TRANSFORMER["joint_attention_dim"])
            embeds[prefix + "pooled_prompt_embeds"] = torch.randn(WIDE_TRANSFORMER["pooled_projection_dim"])
        save_file(embeds, os.path.join(work_dir, "input.safetensors"))
        return
    from diffusers import AutoencoderKL
    AutoencoderKL(**FLUX_VAE_CONFIG).save_pretrained(os.path.join(work_dir, "vae"), safe_serialization=True)
    if work == "vae-encode":
        x = torch.rand(1, 3, side, side) * 2 - 1
    else:
        x = torch.randn(1, FLUX_VAE_CONFIG["latent_channels"], side // 8, side // 8)
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
    parser.add_argument("--cases", default="vae-encode:256:fp32,vae-encode:512:fp32,vae-encode:512:bf16,"
                                           "vae-decode:256:fp32,vae-decode:512:fp32,denoise:256:fp32,denoise-cfg:256:fp32")
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
            if work not in ("vae-encode", "vae-decode", "denoise", "denoise-cfg") or dtype not in ("fp32", "bf16"):
                raise SystemExit("a case is <vae-encode|vae-decode|denoise|denoise-cfg>:<side>:<fp32|bf16>, got %r"
                                 % case)
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
            rows.append((case, med, agreement(work_dir)))
            print(case, json.dumps(med), flush=True)
    lines = ["| work | remat time | diffusers time | time ratio | remat peak (tracked / RSS) | "
             "diffusers peak (tracked / RSS) | peak ratio (tracked / RSS) | max rel. difference |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for case, m, diff in rows:
        r, d = m["remat"], m["diffusers"]
        lines.append("| %s | %.3f s | %.3f s | %.2f | %s / %s | %s / %s | %.2f / %.2f | %.1e |" % (
            case, r["seconds"], d["seconds"], r["seconds"] / d["seconds"],
            mib(r["tracked_peak"]), mib(r["rss_peak"]), mib(d["tracked_peak"]), mib(d["rss_peak"]),
            r["tracked_peak"] / d["tracked_peak"], r["rss_peak"] / max(d["rss_peak"], 1), diff))
    table = "\n".join(lines)
    print(table)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write("%d rounds, medians; %d thread(s)\n\n%s\n" % (args.rounds, args.threads, table))


if __name__ == "__main__":
    main()
