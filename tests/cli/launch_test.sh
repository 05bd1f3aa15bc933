#!/usr/bin/env bash
# `remat launch` as users run it: bad flags exit 2 naming the flag, the value and what is valid;
# workers are the same binary, each output line prefixed with its rank; a failing worker makes the
# launcher exit with its code, naming its rank. (Environment, signals and stopping: launch_tests.)
# Usage: launch_test.sh <remat binary>
set -u
remat=$1
source "$(dirname "$0")/expect.sh"

expect 0 "LOCAL_WORLD_SIZE=N" -- "$remat" launch --help
expect 0 "(137 for SIGKILL)" -- "$remat" launch --help
expect 2 "[launch] --nproc_per_node must be an integer in [1, 1024] (workers on this node), got '0'" -- "$remat" launch --nproc_per_node 0 -- train
expect 2 "got 'two'" -- "$remat" launch --nproc-per-node=two -- train
expect 2 "[launch] --master_port must be a port in [1, 65535], got '70000'" -- "$remat" launch --nproc_per_node 2 --master_port 70000 -- train
expect 2 "[launch] --node_rank must be an integer in [0, 1] (below --nnodes 2), got '2'" -- "$remat" launch --nnodes 2 --node_rank 2 -- train
expect 2 "a command to run is required after --" -- "$remat" launch --nproc_per_node 2
expect 2 "unknown option '--nproc'" -- "$remat" launch --nproc 2 -- train
expect 2 "must be a remat command other than launch, got 'frobnicate'" -- "$remat" launch --nproc_per_node 2 -- frobnicate
expect 2 "must be a remat command other than launch, got 'launch'" -- "$remat" launch -- launch --nproc_per_node 2 -- train

# Two workers, each `remat help`: every stdout line carries its rank, both ranks print everything.
out_file=$(mktemp)
err_file=$(mktemp)
trap 'rm -f "$out_file" "$err_file"' EXIT
"$remat" launch --nproc_per_node 2 -- help > "$out_file" 2> "$err_file"
status=$?
single=$("$remat" help | wc -l)
[[ $status -eq 0 ]] || fail "launch -- help exited $status: $(cat "$err_file")"
grep -qv '^\[rank[01]\]: ' "$out_file" && fail "a stdout line without a rank prefix: $(grep -v '^\[rank[01]\]: ' "$out_file" | head -1)"
for rank in 0 1; do
  n=$(grep -c "^\[rank$rank\]: " "$out_file")
  [[ $n -eq $single ]] || fail "rank $rank printed $n lines, \`remat help\` prints $single"
  grep -q "^\[rank$rank\]: usage: remat <command>" "$out_file" || fail "rank $rank's usage line is missing"
done
grep -q "^\[launch\] starting 2 worker(s), ranks 0-1 of world size 2" "$err_file" || fail "no start line: $(cat "$err_file")"
[[ $failures -eq 0 ]] && echo "ok: launch -- help: $single lines from each rank, all prefixed"

# Both workers refuse a bad option (exit 2): the launcher exits 2, naming a rank and the code,
# after the worker's own error, prefixed.
"$remat" launch --nproc_per_node 2 -- train --lora_rank=0 > "$out_file" 2> "$err_file"
status=$?
[[ $status -eq 2 ]] || fail "a worker exiting 2: launcher exited $status (want 2)"
grep -Eq '^\[launch\] rank [01] \(pid [0-9]+\) exited with code 2' "$err_file" || fail "no failure line: $(cat "$err_file")"
grep -q '^\[rank[01]\]: remat train: error: .*lora_rank' "$err_file" || fail "the worker's error is missing: $(cat "$err_file")"
[[ $status -eq 2 ]] && echo "ok: a failing worker -> launcher exit 2, rank named"

if [[ $failures -ne 0 ]]; then
  echo "$failures failure(s)"
  exit 1
fi
echo "all launch CLI checks passed"
