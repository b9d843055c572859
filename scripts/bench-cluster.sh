#!/usr/bin/env bash
# Benchmark recipe for README "Performance / Scaling out" (not a test): `tessera-loadgen run`
# against 1 node on SQLite and 1, 2 and 3 nodes on PostgreSQL (cluster mode: NATS), with one
# mock LLM. Prints, per setup: turns/s, server CPU per turn (every `tessera` node's user+system
# time over the run, from /proc/PID/stat), PostgreSQL CPU per turn (every `postgres` process),
# and the worst node's turn p99.
#
#   scripts/bench-cluster.sh                 # every setup
#   SETUPS="sqlite pg1" scripts/bench-cluster.sh
#
# Needs: a release build (built here), PostgreSQL at $PG_URL (a scratch database: it is
# dropped and re-created for each setup), NATS with JetStream at $NATS_URL, and `jq`.
# Several nodes share the load by running one load generator per node, each with its share of
# the chats (as clients spread by a load balancer would be); turns/s is their sum.
set -euo pipefail
cd "$(dirname "$0")/.."

PG_ADMIN_URL=${PG_ADMIN_URL:-postgres://postgres@127.0.0.1:5432/postgres}
PG_DB=${PG_DB:-tessera_bench}
PG_URL=${PG_URL:-postgres://postgres@127.0.0.1:5432/$PG_DB}
NATS_URL=${NATS_URL:-nats://127.0.0.1:4222}
CHATS=${CHATS:-1000}
TURNS=${TURNS:-10}
SETUPS=${SETUPS:-"sqlite pg1 pg2 pg3"}
WORK=${WORK:-$(mktemp -d /tmp/tessera-bench.XXXXXX)}

command -v jq >/dev/null || { echo "needs jq" >&2; exit 1; }
command -v psql >/dev/null || { echo "needs psql (PostgreSQL client)" >&2; exit 1; }

cargo build --release -p tessera-loadgen -p tessera-server
LOADGEN=target/release/tessera-loadgen
TESSERA=target/release/tessera

pids=()
cleanup() {
  for pid in "${pids[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
  wait 2>/dev/null || true
}
trap cleanup EXIT

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

# user+system clock ticks of the given pids (0 for a pid that is gone).
cpu_ticks() {
  local total=0 pid
  for pid in "$@"; do
    if [ -r "/proc/$pid/stat" ]; then
      # Fields 14 and 15 (utime, stime), after the parenthesised command name.
      total=$((total + $(sed 's/^.*) //' "/proc/$pid/stat" | awk '{print $12 + $13}')))
    fi
  done
  echo "$total"
}

postgres_pids() {
  pgrep -x postgres || true
}

"$LOADGEN" mock-llm --port 0 --latency-ms 0 >"$WORK/mock.log" 2>&1 &
pids+=($!)
MOCK=$(wait_listening "$WORK/mock.log")

run_setup() {
  local setup=$1 nodes store_url
  case $setup in
    sqlite) nodes=1 store_url="" ;;
    pg[1-9]) nodes=${setup#pg} store_url=$PG_URL ;;
    *) echo "unknown setup $setup" >&2; exit 1 ;;
  esac
  if [ -n "$store_url" ]; then
    psql -q "$PG_ADMIN_URL" -c "DROP DATABASE IF EXISTS $PG_DB" -c "CREATE DATABASE $PG_DB"
  fi
  local node_pids=() urls=() i
  for ((i = 1; i <= nodes; i++)); do
    local dir=$WORK/$setup/node$i
    mkdir -p "$dir"
    (
      export OPENAI_BASE_URL=http://$MOCK/v1 OPENAI_API_KEY=test
      export TESSERA_MESSAGES_PER_MINUTE=100000000 TESSERA_MESSAGES_PER_MINUTE_PER_TENANT=0
      export TESSERA_MAX_OPEN_CHATS_PER_TENANT=0 TESSERA_IDLE_TIMEOUT_S=600 RUST_LOG=warn
      export TESSERA_DATA_DIR=$dir/data
      if [ -n "$store_url" ]; then export TESSERA_STORE_URL=$store_url; fi
      if ((nodes > 1)); then export TESSERA_NATS_URL=$NATS_URL TESSERA_NODE_ID=bench-$i; fi
      exec "$TESSERA" serve --bind 127.0.0.1:0
    ) >"$dir/server.log" 2>&1 &
    node_pids+=($!)
    pids+=($!)
    urls+=("http://$(wait_listening "$dir/server.log")")
  done
  local per_node=$((CHATS / nodes))
  local pg_before node_before started
  # shellcheck disable=SC2046 # one pid per word
  pg_before=$(cpu_ticks $(postgres_pids))
  node_before=$(cpu_ticks "${node_pids[@]}")
  started=$(date +%s.%N)
  local gens=()
  for ((i = 0; i < nodes; i++)); do
    "$LOADGEN" run --url "${urls[$i]}" --chats "$per_node" --turns "$TURNS" \
      --server-pid "${node_pids[$i]}" --json "$WORK/$setup/run$i.json" >"$WORK/$setup/run$i.log" 2>&1 &
    gens+=($!)
  done
  local failed=0
  for pid in "${gens[@]}"; do
    wait "$pid" || failed=1
  done
  local elapsed pg_after node_after hz turns
  elapsed=$(echo "$(date +%s.%N) - $started" | bc)
  # shellcheck disable=SC2046
  pg_after=$(cpu_ticks $(postgres_pids))
  node_after=$(cpu_ticks "${node_pids[@]}")
  hz=$(getconf CLK_TCK)
  turns=$((per_node * nodes * TURNS))
  local p99
  p99=$(jq -s 'map(.turn_latency.p99_ms // 0) | max' "$WORK/$setup"/run*.json)
  awk -v s="$setup" -v t="$turns" -v e="$elapsed" -v n="$((node_after - node_before))" \
    -v p="$((pg_after - pg_before))" -v hz="$hz" -v p99="$p99" -v f="$failed" 'BEGIN {
      printf "%-7s turns/s %8.0f  tessera CPU/turn %.3f ms  postgres CPU/turn %.3f ms  p99 %s ms%s\n",
        s, t / e, n * 1000 / hz / t, p * 1000 / hz / t, p99, (f ? "  (a load generator reported a failed check)" : "")
    }'
  for pid in "${node_pids[@]}"; do
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
}

for setup in $SETUPS; do
  run_setup "$setup"
done
echo "logs and JSON summaries: $WORK"
