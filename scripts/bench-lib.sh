# shellcheck shell=bash
# Shared by the benchmark scripts (sourced, not run): children to stop on exit, and the
# address a child reports when it listens.

pids=()
# shellcheck disable=SC2329 # run by the EXIT trap
cleanup() {
  for pid in "${pids[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
  wait 2>/dev/null || true
}
trap cleanup EXIT

# A build or the previous run's deleted database can leave gigabytes of dirty pages, and their
# writeback would compete with this run's fsyncs and CPU: start with them written.
sync

# The address a child prints on its first "listening on http://ADDR" line.
wait_listening() {
  local log=$1 deadline=$((SECONDS + 60))
  while ((SECONDS < deadline)); do
    if grep -qoE 'listening on http://[0-9.:]+' "$log" 2>/dev/null; then
      grep -oE 'listening on http://[0-9.:]+' "$log" | head -1 | sed 's#listening on http://##'
      return 0
    fi
    sleep 0.2
  done
  echo "nothing listening after 60 s; see $log" >&2
  exit 1
}
