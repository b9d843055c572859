#!/usr/bin/env bash
# Idle chats on a two-node cluster: each node evicts chats idle for EVICT_S seconds. Drives
# CHATS chats x TURNS turns on node 1 (every socket on its chat's node), then prints what node
# 1 owns and its RSS right after the load generator exits (its sockets closed) and WAIT_S
# seconds later. With idle eviction in cluster mode (thirty-sixth session) node 1 owns 0
# chats by then and has parked their leases; before, it kept every one.
#
#   BUILD=0 TESSERA=/path/to/tessera scripts/cluster-idle.sh
#   CROSS=1 EVICT_S=1 RUN_ARGS="--think-ms 3000" CHATS=300 TURNS=4 scripts/cluster-idle.sh
#     (sockets on node 2, users slower than the eviction: followed chats must not leave)
#
# Needs PostgreSQL (PG_ADMIN_URL, a database to drop and create: PG_DB) and NATS (NATS_URL).
set -euo pipefail
cd "$(dirname "$0")/.."

PG_ADMIN_URL=${PG_ADMIN_URL:-postgres://postgres@127.0.0.1:5432/test}
PG_DB=${PG_DB:-tessera_idle_cluster}
PG_URL=${PG_URL:-postgres://postgres@127.0.0.1:5432/$PG_DB}
NATS_URL=${NATS_URL:-nats://127.0.0.1:4222}
CHATS=${CHATS:-2000}
TURNS=${TURNS:-2}
EVICT_S=${EVICT_S:-5}
WAIT_S=${WAIT_S:-15}
RUN_ARGS=${RUN_ARGS:-}
BUILD=${BUILD:-1}
WORK=$(mktemp -d /tmp/tessera-idle.XXXXXX)

command -v psql >/dev/null || { echo "needs psql (PostgreSQL client)" >&2; exit 1; }
if [ "$BUILD" = 1 ]; then
  cargo build --release -p tessera-loadgen -p tessera-server
fi
LOADGEN=${LOADGEN:-target/release/tessera-loadgen}
TESSERA=${TESSERA:-target/release/tessera}

# shellcheck source=scripts/bench-lib.sh
source scripts/bench-lib.sh

"$LOADGEN" mock-llm --port 0 --latency-ms 0 >"$WORK/mock.log" 2>&1 &
pids+=($!)
MOCK=$(wait_listening "$WORK/mock.log")
psql -q "$PG_ADMIN_URL" -c "DROP DATABASE IF EXISTS $PG_DB" -c "CREATE DATABASE $PG_DB"

urls=() node_pids=()
for i in 1 2; do
  mkdir -p "$WORK/node$i"
  (
    export OPENAI_BASE_URL=http://$MOCK/v1 OPENAI_API_KEY=test
    export TESSERA_MESSAGES_PER_MINUTE=100000000 TESSERA_MESSAGES_PER_MINUTE_PER_TENANT=0
    export TESSERA_MAX_OPEN_CHATS_PER_TENANT=0 RUST_LOG=warn
    export TESSERA_DATA_DIR=$WORK/node$i/data TESSERA_STORE_URL=$PG_URL
    export TESSERA_NATS_URL=$NATS_URL TESSERA_NODE_ID=idle-$i TESSERA_NATS_PREFIX=idle$$
    export TESSERA_IDLE_CHAT_EVICT_S=$EVICT_S
    exec "$TESSERA" serve --bind 127.0.0.1:0
  ) >"$WORK/node$i/server.log" 2>&1 &
  pids+=($!)
  node_pids+=($!)
  urls+=("http://$(wait_listening "$WORK/node$i/server.log")")
done

ws=()
if [ "${CROSS:-0}" = 1 ]; then ws=(--ws-url "${urls[1]}"); fi
# shellcheck disable=SC2086 # RUN_ARGS is a list of options
"$LOADGEN" run --url "${urls[0]}" "${ws[@]}" --chats "$CHATS" --turns "$TURNS" $RUN_ARGS \
  --json "$WORK/run.json" >"$WORK/run.log" 2>&1

show() {
  local metrics rss
  metrics=$(curl -s "${urls[0]}/metrics" |
    grep -E '^tessera_(chats_in_memory|cluster_owned_chats|cluster_leases_parked_total) ' | tr '\n' ' ')
  rss=$(awk '/VmRSS/ {print int($2 / 1024)}' "/proc/${node_pids[0]}/status")
  echo "$1: ${metrics}RSS ${rss} MiB"
}
show "node 1 after the run"
sleep "$WAIT_S"
show "node 1 ${WAIT_S} s later"
jq -c '{errors, protocol_violations, turns_per_s}' "$WORK/run.json"
echo "logs: $WORK"
