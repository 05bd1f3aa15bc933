#!/usr/bin/env python3
"""The FLUX.1-dev LoRA planning table of docs/FIT_IN_N_GB.md: `remat plan` for each resolution and
base precision over the budgets, one Markdown row per (budget, resolution, precision): the blocks
streamed, the checkpointing the options ask for (with the attention offload when the plan takes
it), the predicted device peak, host memory and
step-time factor.

usage: bench/plan_table.py --remat build/apps/remat/remat [--rank 16] > table.md
"""
import argparse
import re
import subprocess
import sys

BUDGETS = ["8GiB", "10GiB", "12GiB", "16GiB", "24GiB", "40GiB", "80GiB"]
PRECISIONS = ["no_change", "int8-quanto", "nf4-bnb"]
RESOLUTIONS = [512, 1024]


def plan(remat, resolution, precision, rank):
    args = [remat, "plan", "--model_family", "flux", "--model_flavour", "dev", "--model_type", "lora",
            "--lora_rank", str(rank), "--resolution", str(resolution), "--train_batch_size", "1",
            "--base_model_precision", precision, "--budget", ",".join(BUDGETS)]
    run = subprocess.run(args, capture_output=True, text=True)
    if run.returncode not in (0, 2):
        sys.exit(f"remat plan failed ({run.returncode}): {run.stderr}")
    plans = {}
    for block in run.stdout.split("\nbudget ")[1:]:
        budget = block.split(":", 1)[0].strip()
        peak = re.search(r"predicted device peak: ([^\n]+?) of", block)
        host = re.search(r"host memory: ([^\n]+?) streamed weights \(pinned\), ([^\n]+?) offloaded", block)
        factor = re.search(r"step-time factor: ([0-9.]+)", block)
        options = re.search(r"options: ([^\n]+)", block)
        if not peak:
            continue  # nothing fits: the error is on stderr
        plans[budget] = (peak.group(1), host.group(1), host.group(2), factor.group(1), options.group(1))
    errors = {}
    for line in run.stderr.splitlines():
        m = re.match(r"remat plan: error: nothing fits in ([^:]+): the smallest predicted device peak is ([^,]+),", line)
        if m:
            errors[m.group(1)] = m.group(2)
    return plans, errors


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--remat", required=True)
    parser.add_argument("--rank", type=int, default=16)
    a = parser.parse_args()
    results = {}
    for resolution in RESOLUTIONS:
        for precision in PRECISIONS:
            results[(resolution, precision)] = plan(a.remat, resolution, precision, a.rank)
    print("| budget | px | base | musubi_blocks_to_swap | checkpointing | predicted peak | host: weights / activations | step-time factor |")
    print("| --- | --- | --- | ---: | --- | ---: | --- | ---: |")
    for budget in BUDGETS:
        shown = budget.replace("GiB", ".00 GiB")
        for resolution in RESOLUTIONS:
            for precision in PRECISIONS:
                plans, errors = results[(resolution, precision)]
                if shown not in plans:
                    smallest = errors.get(shown, "?")
                    print(f"| {budget} | {resolution} | {precision} | | nothing fits (smallest peak {smallest}) | | | |")
                    continue
                peak, weights, activations, factor, options = plans[shown]
                swap = re.search(r"musubi_blocks_to_swap=(\d+)", options)
                if "gradient_checkpointing=false" in options:
                    layout = "off (every block kept)"
                elif "interval=auto" in options:
                    layout = "auto" + (" + unsloth" if "unsloth" in options else "")
                else:
                    layout = "interval " + re.search(r"interval=(\d+)", options).group(1)
                if "offload_attention=true" in options:
                    layout += " + attention offload"
                print(f"| {budget} | {resolution} | {precision} | {swap.group(1) if swap else 0} | {layout} | {peak} | "
                      f"{weights} / {activations} | {factor} |")

if __name__ == "__main__":
    main()
