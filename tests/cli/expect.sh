# Shared by the CLI test scripts (sourced): a failure counter and `expect`, which runs a command
# and checks its exit code and that its output (stdout and stderr) contains a text.

failures=0

fail() {
  echo "FAIL: $1"
  failures=$((failures + 1))
}

# expect <exit code> <text the output must contain> -- <command...>
expect() {
  local code=$1 text=$2
  shift 3
  local out status
  out=$("$@" 2>&1)
  status=$?
  if [[ $status -ne $code ]] || [[ "$out" != *"$text"* ]]; then
    fail "'$*' exited $status (want $code), output:"
    echo "$out" | head -5
    echo "  (wanted it to contain: $text)"
  else
    echo "ok: $* -> $status"
  fi
}
