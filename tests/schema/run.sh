#!/usr/bin/env bash
# CTest: `remat options --json` is a valid Draft 2020-12 JSON Schema that accepts every config in
# configs/, the config examples in the docs and the SimpleTuner-style test configs, checked with
# an independent validator: Debian's python3-jsonschema (tests/schema/validate.py; installed by
# scripts/install-deps.sh).
# Usage: run.sh <remat binary> <source dir>
set -euo pipefail
remat=$1
root=$2
python=/usr/bin/python3
if ! "$python" -c 'import jsonschema' 2>/dev/null; then
  echo "FAIL: $python cannot import jsonschema (Debian: apt-get install python3-jsonschema)" >&2
  exit 1
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$remat" options --json > "$work/schema.json"
"$python" "$root/tests/schema/validate.py" "$work/schema.json" "$root"/configs/*.json \
  "$root"/tests/cli/simpletuner_configs/*.json "$root"/docs/*.md "$root/README.md"
