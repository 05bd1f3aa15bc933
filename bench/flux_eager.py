#!/usr/bin/python3
"""Flux.1 transformer in PyTorch eager: an independent reference for remat's C++ Flux model.

Written independently of diffusers' code, from a description of what its `FluxTransformer2DModel`
(src/diffusers/models/transformers/transformer_flux.py) computes: the modules are
registered under diffusers' `FluxTransformer2DModel` state-dict names, so a diffusers checkpoint
(or a file written by `remat init`) loads with no remapping. Numerics follow diffusers:
  * timestep and guidance: ×1000 in the activation dtype, a 256-channel [cos | sin] sinusoid in
    float32, cast to the dtype of pooled_projections;
  * RoPE tables in float64 cast to float32, interleaved adjacent pairs, rotation in float32;
  * RMSNorm over the head dim in float32 (eps 1e-6), cast back, times the weight;
  * LayerNorm without affine, eps 1e-6; GELU-tanh; single-block proj_out input [attn | mlp];
    norm_out chunks (scale, shift); the output keeps the image tokens only;
  * attention: softmax(q kᵀ / √d) v with the softmax in float32 — the composite remat uses on
    LibTorch 1.13, which has no fused scaled_dot_product_attention.

Gradient checkpointing follows SimpleTuner's FluxTransformer2DModel.forward
(simpletuner/helpers/models/flux/transformer.py) and its checkpoint_sequential_state
(simpletuner/helpers/training/gradient_checkpointing_interval.py): layouts "off", "1" (every
block), "N" (segments of N blocks), "N/S" (segments of N blocks every S blocks, the S-N between
run eagerly) and "ffn" (only the feed-forward part of every block). The double and single stacks
are segmented independently.

Subcommands (run with /usr/bin/python3, which has Debian's torch):
  bench        training-step timings and tracked CPU peaks per checkpoint layout (JSON)
  forward      float32 forward pass of given weights on given inputs (safetensors in and out)
  make-inputs  random inputs with img_ids on a row-major grid and zero txt_ids
  init         random weights in diffusers key format
"""

import argparse
import ctypes
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_lite  # noqa: E402  (sibling files, found through the path set above)
from flux_model import (  # noqa: E402
    FluxConfig, FluxTransformer, Layout, add_lora, init_weights, load_weights_strict, make_inputs)

# ---------------------------------------------------------------------------------------------
# CPU memory tracking through remat (bench/pytrack.cpp)


class PyTrack:
    """remat's CPU peak tracker loaded with ctypes; `None` library = no tracking (peaks None)."""

    def __init__(self, path):
        self.lib = None
        if not path:
            return
        if not os.path.exists(path):
            raise FileNotFoundError(f"[flux_eager] --pytrack must name libremat_pytrack.so, got {path!r} (not found; "
                                    f"build it with -DREMAT_BUILD_BENCHMARKS=ON and `ninja remat_pytrack`)")
        lib = ctypes.CDLL(os.path.abspath(path))
        lib.remat_install_cpu_tracking.restype = ctypes.c_int
        lib.remat_current_bytes.restype = ctypes.c_int64
        lib.remat_peak_bytes.restype = ctypes.c_int64
        lib.remat_reset_peak.restype = None
        if not lib.remat_install_cpu_tracking():
            raise RuntimeError("[flux_eager] remat could not wrap LibTorch's CPU allocator")
        self.lib = lib

    def reset_peak(self):
        if self.lib:
            self.lib.remat_reset_peak()

    def current_bytes(self):
        return self.lib.remat_current_bytes() if self.lib else None

    def peak_bytes(self):
        return self.lib.remat_peak_bytes() if self.lib else None


# ---------------------------------------------------------------------------------------------
# Commands

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def run_bench(args):
    """One model (parameters in --dtype), one AdamW over the trainable parameters, fixed x0 and
    text inputs; per step: zero_grad(set_to_none) -> reset peak -> fresh noise and sigma ->
    x_t = (1 - sigma) x0 + sigma noise -> forward -> MSE(prediction, noise - x0) in float32 ->
    backward -> AdamW step. step/forward/backward times are medians over --steps; peak_bytes is the
    highest tracked CPU figure during a step, absolute (parameters, gradients, optimizer state,
    inputs and activations together), taken over all measured steps."""
    tracker = PyTrack(args.pytrack)  # first: tensors made before are not tracked
    torch.set_num_threads(args.threads)
    layouts = [Layout(text) for text in args.layouts.split(",") if text]
    if not layouts:
        raise ValueError("[flux_eager] --layouts must list at least one layout, got ''")
    config = FluxConfig.from_json(args.config)
    dtype = DTYPES[args.dtype]
    torch.manual_seed(args.seed)
    model = FluxTransformer(config).to(dtype)
    model.train()
    if args.lora_rank > 0:
        add_lora(model, args.lora_rank)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-5)
    generator = torch.Generator().manual_seed(args.seed)
    data = make_inputs(config, args.image_tokens, args.text_tokens, args.batch, generator, dtype)
    x0 = data.pop("hidden_states")
    data.pop("timestep")

    def train_step(layout):
        optimizer.zero_grad(set_to_none=True)
        tracker.reset_peak()
        start = time.perf_counter()
        noise = torch.randn(x0.shape, generator=generator).to(dtype)
        sigma = torch.rand(args.batch, generator=generator).to(dtype)
        sigma_b = sigma[:, None, None]
        x_t = (1 - sigma_b) * x0 + sigma_b * noise
        prediction = model(x_t, timestep=sigma, layout=layout, **data)
        loss = F.mse_loss(prediction.float(), (noise - x0).float())
        forward_end = time.perf_counter()
        loss.backward()
        backward_end = time.perf_counter()
        peak_before_optimizer = tracker.peak_bytes()
        optimizer.step()
        end = time.perf_counter()
        return (end - start, forward_end - start, backward_end - forward_end, tracker.peak_bytes(),
                peak_before_optimizer)

    for _ in range(args.warmup):
        for layout in layouts:
            train_step(layout)
    samples = {layout.text: [] for layout in layouts}
    for _ in range(args.steps):  # round-robin, so drift in machine load hits every layout alike
        for layout in layouts:
            samples[layout.text].append(train_step(layout))

    records = []
    for layout in layouts:
        rows = samples[layout.text]
        peaks = [row[3] for row in rows if row[3] is not None]
        peaks_fb = [row[4] for row in rows if row[4] is not None]
        records.append({
            "layout": layout.text,
            "median_step_s": statistics.median(row[0] for row in rows),
            "median_forward_s": statistics.median(row[1] for row in rows),
            "median_backward_s": statistics.median(row[2] for row in rows),
            "peak_bytes": max(peaks) if peaks else None,
            # The same peak up to the end of backward: the optimizer step's temporaries excluded.
            "peak_forward_backward_bytes": max(peaks_fb) if peaks_fb else None,
            "steps": args.steps, "warmup": args.warmup, "dtype": args.dtype, "lora_rank": args.lora_rank,
            "threads": args.threads, "batch": args.batch, "image_tokens": args.image_tokens,
            "text_tokens": args.text_tokens, "trainable_parameters": sum(p.numel() for p in trainable),
            "implementation": f"pytorch-eager {torch.__version__}",
        })
    text = json.dumps(records, indent=2)
    if args.json:
        write_text_atomic(args.json, text + "\n")
    print(text)


def write_text_atomic(path, text):
    temporary = f"{path}.tmp{os.getpid()}"
    with open(temporary, "w") as handle:
        handle.write(text)
    os.replace(temporary, path)


INPUT_NAMES = ("hidden_states", "encoder_hidden_states", "pooled_projections", "timestep", "img_ids", "txt_ids")


def run_forward(args):
    torch.set_num_threads(args.threads)
    config = FluxConfig.from_json(args.config)
    model = FluxTransformer(config).eval()
    weights, _ = safetensors_lite.load_file(args.weights)
    load_weights_strict(model, weights)
    inputs, _ = safetensors_lite.load_file(args.inputs)
    missing = [name for name in INPUT_NAMES if name not in inputs]
    if missing:
        raise ValueError(f"[flux_eager] inputs must contain {list(INPUT_NAMES)} (+ guidance), missing {missing}")
    kwargs = {name: inputs[name].float() for name in INPUT_NAMES}
    kwargs["guidance"] = inputs["guidance"].float() if "guidance" in inputs else None
    with torch.no_grad():
        sample = model(**kwargs)
    safetensors_lite.save_file({"sample": sample.contiguous()}, args.output,
                               metadata={"producer": "bench/flux_eager.py forward"})
    print(f"sample {tuple(sample.shape)} written to {args.output}")


def run_make_inputs(args):
    config = FluxConfig.from_json(args.config)
    generator = torch.Generator().manual_seed(args.seed)
    inputs = make_inputs(config, args.image_tokens, args.text_tokens, args.batch, generator)
    safetensors_lite.save_file(inputs, args.output, metadata={"producer": "bench/flux_eager.py make-inputs"})
    print(f"{len(inputs)} inputs written to {args.output}")


def run_init(args):
    config = FluxConfig.from_json(args.config)
    model = FluxTransformer(config)
    init_weights(model, torch.Generator().manual_seed(args.seed))
    safetensors_lite.save_file(model.state_dict(), args.output, metadata={"producer": "bench/flux_eager.py init"})
    print(f"{len(model.state_dict())} tensors written to {args.output}")


def positive_int(minimum):
    def parse(text):
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {text}")
        return value
    return parse


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)

    def shape_flags(sub):
        sub.add_argument("--config", required=True, help="diffusers transformer config.json")
        sub.add_argument("--image_tokens", type=positive_int(1), default=64, help="N_i (default 64)")
        sub.add_argument("--text_tokens", type=positive_int(1), default=32, help="N_t (default 32)")
        sub.add_argument("--batch", type=positive_int(1), default=1, help="B (default 1)")

    bench = commands.add_parser("bench", help="training-step time and tracked peak per checkpoint layout")
    shape_flags(bench)
    bench.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    bench.add_argument("--layouts", default="off,1", help="comma list of off, 1, N, N/S, ffn (default off,1)")
    bench.add_argument("--steps", type=positive_int(1), default=5, help="measured steps per layout (default 5)")
    bench.add_argument("--warmup", type=positive_int(0), default=1, help="unmeasured steps per layout (default 1)")
    bench.add_argument("--lora_rank", type=positive_int(0), default=0, help="0 = full fine-tune (default 0)")
    bench.add_argument("--threads", type=positive_int(1), default=torch.get_num_threads())
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument("--json", help="write the records here as well as to stdout")
    bench.add_argument("--pytrack", help="path to libremat_pytrack.so (without it peak_bytes is null)")
    bench.set_defaults(run=run_bench)

    forward = commands.add_parser("forward", help="float32 forward of given weights on given inputs")
    forward.add_argument("--config", required=True)
    forward.add_argument("--weights", required=True, help="safetensors, diffusers key names")
    forward.add_argument("--inputs", required=True, help="safetensors from make-inputs (or the same names)")
    forward.add_argument("--output", required=True, help="safetensors with one tensor, sample")
    forward.add_argument("--threads", type=positive_int(1), default=torch.get_num_threads())
    forward.set_defaults(run=run_forward)

    inputs = commands.add_parser("make-inputs", help="random float32 inputs for forward")
    shape_flags(inputs)
    inputs.add_argument("--seed", type=int, default=0)
    inputs.add_argument("--output", required=True)
    inputs.set_defaults(run=run_make_inputs)

    init = commands.add_parser("init", help="seeded random weights, diffusers key names, float32")
    init.add_argument("--config", required=True)
    init.add_argument("--seed", type=int, default=0)
    init.add_argument("--output", required=True)
    init.set_defaults(run=run_init)
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        args.run(args)
    except (ValueError, FileNotFoundError, safetensors_lite.SafetensorsError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
