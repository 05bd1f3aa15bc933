#!/usr/bin/python3
"""remat vs PyTorch eager on the same Flux training step: time and tracked CPU peak per layout.

Runs `remat bench --model flux ...` (C++) and `bench/flux_eager.py bench ...` (PyTorch eager, with
remat's tracking allocator loaded through libremat_pytrack.so, so both peaks are counted by the same
code) with identical settings, alternating the two programs (remat first in even rounds, PyTorch
first in odd ones, so slow drift in machine load hits both alike), then prints per layout the
median over rounds of each program's median step time and peak:

  layout | remat step (s) | PyTorch step (s) | time ratio | remat peak | PyTorch peak | peak ratio | remat predicted

Thread count: both programs get OMP_NUM_THREADS / MKL_NUM_THREADS = --threads; flux_eager.py also
gets --threads. --markdown writes the table and the machine facts for docs/PERFORMANCE.md.

example:
  bench/compare_pytorch.py --config flux-tiny.json --image_tokens 256 --text_tokens 64 \\
      --layouts off,1,2,4,8,2/4,ffn --steps 5 --warmup 1 --markdown perf.md
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.path.dirname(HERE)
PYTHON = "/usr/bin/python3"  # Debian's interpreter: the one with python3-torch


class CompareError(RuntimeError):
    """A program failed or produced output this script cannot use."""


def format_bytes(count):
    if count is None:
        return "n/a"
    value, unit = float(count), 0
    units = ["B", "KiB", "MiB", "GiB", "TiB"]
    while abs(value) >= 1024 and unit < len(units) - 1:
        value /= 1024
        unit += 1
    return f"{int(count)} B" if unit == 0 else f"{value:.2f} {units[unit]}"


def ratio(numerator, denominator):
    if numerator is None or denominator in (None, 0):
        return "n/a"
    return f"{numerator / denominator:.2f}"


def seconds(value):
    return "n/a" if value is None else f"{value:.4f}"


def median_or_none(values):
    values = [value for value in values if value is not None]
    return statistics.median(values) if values else None


def run_program(name, command, env, timeout):
    """Runs `command`; raises CompareError with the command and its output tail on failure."""
    print(f"[compare] {name}: {' '.join(command)}", file=sys.stderr, flush=True)
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError as error:
        raise CompareError(f"{name} could not start: {error}") from None
    except subprocess.TimeoutExpired:
        raise CompareError(f"{name} ran past --timeout {timeout} s: {' '.join(command)}") from None
    if done.returncode != 0:
        tail = (done.stdout[-2000:] + "\n" + done.stderr[-4000:]).strip()
        raise CompareError(f"{name} exited with status {done.returncode}: {' '.join(command)}\n{tail}")


def read_records(name, path, layouts, required):
    """Reads a bench JSON (a list of records) into {layout: record}; checks the fields named in
    `required` and that every requested layout is present."""
    try:
        with open(path) as handle:
            records = json.load(handle)
    except FileNotFoundError:
        raise CompareError(f"{name} wrote no JSON at {path}") from None
    except json.JSONDecodeError as error:
        raise CompareError(f"{name} wrote invalid JSON at {path}: {error}") from None
    if isinstance(records, dict) and isinstance(records.get("records"), list):
        records = records["records"]
    if not isinstance(records, list):
        raise CompareError(f"{name} JSON must be a list of records, got {type(records).__name__}")
    by_layout = {}
    for index, record in enumerate(records):
        if not isinstance(record, dict):
            raise CompareError(f"{name} record {index} must be an object, got {record!r}")
        missing = [field for field in required if field not in record]
        if missing:
            raise CompareError(f"{name} record {index} must have fields {required}, missing {missing}: {record}")
        by_layout[str(record["layout"])] = record
    absent = [layout for layout in layouts if layout not in by_layout]
    if absent:
        raise CompareError(f"{name} JSON must hold every requested layout {layouts}, missing {absent} "
                           f"(got {sorted(by_layout)})")
    return by_layout


def cpu_model():
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def torch_version():
    try:
        done = subprocess.run([PYTHON, "-c", "import torch; print(torch.__version__)"],
                              capture_output=True, text=True, timeout=120)
        return done.stdout.strip() or "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def build_rows(layouts, remat_runs, torch_runs):
    rows = []
    for layout in layouts:
        remat_step = median_or_none(run[layout].get("median_step_s") for run in remat_runs)
        torch_step = median_or_none(run[layout].get("median_step_s") for run in torch_runs)
        remat_peak = median_or_none(run[layout].get("peak_bytes") for run in remat_runs)
        torch_peak = median_or_none(run[layout].get("peak_bytes") for run in torch_runs)
        predicted = median_or_none(run[layout].get("predicted_peak_bytes") for run in remat_runs)
        rows.append([layout, seconds(remat_step), seconds(torch_step), ratio(remat_step, torch_step),
                     format_bytes(remat_peak), format_bytes(torch_peak), ratio(remat_peak, torch_peak),
                     format_bytes(predicted)])
    return rows


HEADER = ["layout", "remat step (s)", "PyTorch step (s)", "time ratio remat/PyTorch", "remat peak",
          "PyTorch peak", "peak ratio remat/PyTorch", "remat predicted peak"]


def text_table(rows):
    widths = [max(len(str(row[i])) for row in [HEADER] + rows) for i in range(len(HEADER))]
    lines = [" | ".join(str(cell).ljust(width) for cell, width in zip(row, widths)) for row in [HEADER] + rows]
    lines.insert(1, "-+-".join("-" * width for width in widths))
    return "\n".join(lines)


def markdown_table(rows):
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "|".join(" --- " for _ in HEADER) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def facts(args, config):
    dims = (f"{config.get('num_layers')} double + {config.get('num_single_layers')} single blocks, "
            f"hidden {config.get('num_attention_heads')}×{config.get('attention_head_dim')}")
    return [
        ("date", datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")),
        ("CPU", f"{cpu_model()} ({os.cpu_count()} logical CPUs)"),
        ("threads", str(args.threads)),
        ("PyTorch (eager side)", torch_version()),
        ("model", f"{os.path.basename(args.config)}: {dims}"),
        ("shape", f"batch {args.batch}, {args.image_tokens} image + {args.text_tokens} text tokens, {args.dtype}"),
        ("training", "full fine-tune" if args.lora_rank == 0 else f"LoRA rank {args.lora_rank} (to_q, to_k, to_v, to_out.0)"),
        ("measurement", f"{args.steps} steps after {args.warmup} warm-up per layout and run, "
                        f"median; {args.rounds} runs per program alternated, median of runs; "
                        f"peaks: tracked CPU bytes (remat's allocator wrapper in both), absolute"),
    ]


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--remat", default=os.path.join(SOURCE_DIR, "build", "apps", "remat", "remat"),
                        help="the remat binary (default build/apps/remat/remat)")
    parser.add_argument("--pytrack", default=os.path.join(SOURCE_DIR, "build", "bench", "libremat_pytrack.so"),
                        help="libremat_pytrack.so for PyTorch peaks (default build/bench/libremat_pytrack.so)")
    parser.add_argument("--config", required=True, help="diffusers Flux transformer config.json")
    parser.add_argument("--image_tokens", type=int, default=256)
    parser.add_argument("--text_tokens", type=int, default=64)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--layouts", default="off,1,2,4,8,2/4,ffn")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--lora_rank", type=int, default=0, help="0 = full fine-tune")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--rounds", type=int, default=2, help="runs of each program (default 2)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per program run")
    parser.add_argument("--remat-arg", action="append", default=[],
                        help="extra argument for remat bench (repeatable)")
    parser.add_argument("--markdown", help="also write the table and machine facts here (Markdown)")
    parser.add_argument("--json", help="also write the raw records of every run here")
    args = parser.parse_args(argv)
    for name in ("image_tokens", "text_tokens", "batch", "steps", "threads", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.warmup < 0 or args.lora_rank < 0:
        parser.error(f"--warmup and --lora_rank must be >= 0, got {args.warmup} and {args.lora_rank}")
    return args


def main(argv=None):
    args = parse_args(argv)
    if not (os.path.isfile(args.remat) and os.access(args.remat, os.X_OK)):
        print(f"error: --remat must be the remat binary, got {args.remat!r} (not found or not executable; "
              f"build it with `ninja -C build remat`)", file=sys.stderr)
        return 2
    if not os.path.isfile(args.config):
        print(f"error: --config must be a config.json, got {args.config!r} (not found)", file=sys.stderr)
        return 2
    with open(args.config) as handle:
        config = json.load(handle)
    pytrack = args.pytrack if os.path.isfile(args.pytrack) else None
    if pytrack is None:
        print(f"warning: {args.pytrack} not found: PyTorch peaks will be n/a "
              f"(configure with -DREMAT_BUILD_BENCHMARKS=ON and build remat_pytrack)", file=sys.stderr)
    layouts = [layout for layout in args.layouts.split(",") if layout]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
    shared = ["--config", args.config, "--image_tokens", str(args.image_tokens), "--text_tokens",
              str(args.text_tokens), "--batch", str(args.batch), "--dtype", args.dtype, "--layouts",
              ",".join(layouts), "--steps", str(args.steps), "--warmup", str(args.warmup),
              "--lora_rank", str(args.lora_rank)]
    remat_runs, torch_runs = [], []
    try:
        with tempfile.TemporaryDirectory(prefix="remat-compare-") as scratch:
            for round_index in range(args.rounds):
                remat_json = os.path.join(scratch, f"remat-{round_index}.json")
                torch_json = os.path.join(scratch, f"pytorch-{round_index}.json")
                remat_cmd = [args.remat, "bench", "--model_family", "flux"] + shared + ["--json", remat_json] + args.remat_arg
                torch_cmd = ([PYTHON, os.path.join(HERE, "flux_eager.py"), "bench"] + shared +
                             ["--threads", str(args.threads), "--json", torch_json] +
                             (["--pytrack", pytrack] if pytrack else []))
                programs = [("remat", remat_cmd), ("pytorch", torch_cmd)]
                for name, command in (programs if round_index % 2 == 0 else programs[::-1]):
                    run_program(name, command, env, args.timeout)
                remat_runs.append(read_records("remat bench", remat_json, layouts,
                                               ["layout", "median_step_s", "peak_bytes"]))
                torch_runs.append(read_records("flux_eager.py bench", torch_json, layouts,
                                               ["layout", "median_step_s", "peak_bytes"]))
    except CompareError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1

    rows = build_rows(layouts, remat_runs, torch_runs)
    machine = facts(args, config)
    print("\n".join(f"{key}: {value}" for key, value in machine))
    print()
    print(text_table(rows))
    if args.markdown:
        body = "\n".join(f"- {key}: {value}" for key, value in machine) + "\n\n" + markdown_table(rows) + "\n"
        write_atomic(args.markdown, body)
    if args.json:
        write_atomic(args.json, json.dumps({"facts": dict(machine), "remat": remat_runs, "pytorch": torch_runs},
                                           indent=2) + "\n")
    return 0


def write_atomic(path, text):
    temporary = f"{path}.tmp{os.getpid()}"
    with open(temporary, "w") as handle:
        handle.write(text)
    os.replace(temporary, path)


if __name__ == "__main__":
    sys.exit(main())
