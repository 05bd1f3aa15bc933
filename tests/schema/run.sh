#!/usr/bin/env bash
# CTest: `remat options --json` is a valid Draft 2020-12 JSON Schema that accepts every config in
# configs/, the config examples in the docs and the SimpleTuner-style test configs, checked with
# Ajv (an independent validator; tests/schema/package.json, installed by scripts/install-deps.sh
# or here with `npm ci` when missing).
# Usage: run.sh <remat binary> <source dir>
set -euo pipefail
remat=$1
root=$2
here="$root/tests/schema"
if [[ ! -d "$here/node_modules/ajv" ]]; then
  (cd "$here" && npm ci --no-audit --no-fund --loglevel=error)
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$remat" options --json > "$work/schema.json"
node "$here/validate.mjs" "$work/schema.json" "$root"/configs/*.json "$root"/tests/cli/simpletuner_configs/*.json \
  "$root"/docs/*.md "$root/README.md"
