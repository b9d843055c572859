#!/usr/bin/env bash
# Benchmark recipe for README "Performance / Scaling out" (not a test): `tessera-loadgen run`
# against 1 node on SQLite and 1, 2 and 3 nodes on PostgreSQL (2 and 3 in cluster mode: NATS),
# with one mock LLM. Prints one line per setup and run:
#   turns/s          the sum of every load generator's turns/s
#   tessera ms/turn  every `tessera` node's user+system CPU over its load generator's window
#                    (all chats connected -> last turn), from `run --server-pid`; "whole run":
#                    their CPU from start to the last turn (chats created and connected too)
#   postgres ms/turn every `postgres` process's CPU over the same window (`run --peer-comm`)
#   nats ms/turn     the `nats-server` process's CPU over the same window (cluster setups)
#   WAL KiB/turn     pg_current_wal_lsn() difference over the whole run (opening the chats too)
#   kept KiB/turn    how much the database grew over the same span (pg_database_size)
#   p50/p99          the worst node's turn latency; RSS: the largest node's peak RSS
# and appends each run's figures as one JSON line to $WORK/results.jsonl.
#
#   scripts/bench-cluster.sh                              # every setup, once
#   SETUPS="sqlite pg1" REPEAT=2 scripts/bench-cluster.sh
#   RUN_ARGS="--ui --think-ms 2000" SETUPS=pg1 scripts/bench-cluster.sh   # UI round trips
#   BUILD=0 TESSERA=/path/to/tessera scripts/bench-cluster.sh             # another build
#   LATENCY_MS=100 SETUPS=pg1 CHATS=3000 TURNS=20 scripts/bench-cluster.sh  # model latency
#   MOCK_ARGS="--stream --token-interval-ms 20 --answer-words 100" SETUPS=pg1 TURNS=5 \
#     scripts/bench-cluster.sh                            # a model that streams at a pace
#   CROSS=1 SETUPS=pg2 scripts/bench-cluster.sh             # every socket on a node that did
#                                                         # not create its chat (handed over;
#                                                         # with TESSERA_HAND_OVER_SOCKETS=false
#                                                         # followed and driven across nodes)
#   AGENT_FIRST=1 CROSS=1 SETUPS=pg2 scripts/bench-cluster.sh  # chats whose agent speaks first
#                                                         # (their first turn runs at creation)
#
# Needs: a release build (built here unless BUILD=0), PostgreSQL at $PG_URL (a scratch
# database: it is dropped and re-created for each run), NATS with JetStream at $NATS_URL, `jq`
# and `psql`. Several nodes share the load by running one load generator per node, each with
# its share of the chats (as clients spread by a load balancer would be, each on the node that
# owns its chat).
set -euo pipefail
cd "$(dirname "$0")/.."

PG_ADMIN_URL=${PG_ADMIN_URL:-postgres://postgres@127.0.0.1:5432/postgres}
PG_DB=${PG_DB:-tessera_bench_pg}
PG_URL=${PG_URL:-postgres://postgres@127.0.0.1:5432/$PG_DB}
NATS_URL=${NATS_URL:-nats://127.0.0.1:4222}
CHATS=${CHATS:-1000}
TURNS=${TURNS:-10}
SETUPS=${SETUPS:-"sqlite pg1 pg2 pg3"}
REPEAT=${REPEAT:-1}
RUN_ARGS=${RUN_ARGS:-}
LATENCY_MS=${LATENCY_MS:-0}
MOCK_ARGS=${MOCK_ARGS:-}
BUILD=${BUILD:-1}
WORK=${WORK:-$(mktemp -d /tmp/tessera-bench.XXXXXX)}
mkdir -p "$WORK"

command -v jq >/dev/null || { echo "needs jq" >&2; exit 1; }
command -v psql >/dev/null || { echo "needs psql (PostgreSQL client)" >&2; exit 1; }

# AGENT_FIRST=1: the chats are of LoadTestAgentFirst, a copy of LoadTest written here whose
# agent speaks first (`"startup_mode": "AgentDriven"`), served alone.
if [ "${AGENT_FIRST:-0}" = 1 ]; then
  agent_first=$WORK/workflows/LoadTestAgentFirst
  mkdir -p "$agent_first"
  cp workflows/LoadTest/*.json "$agent_first/"
  jq '.name = "LoadTestAgentFirst" | .startup_mode = "AgentDriven"' \
    workflows/LoadTest/workflow.json >"$agent_first/workflow.json"
  export TESSERA_WORKFLOWS_DIR=$WORK/workflows
  RUN_ARGS="$RUN_ARGS --workflow LoadTestAgentFirst"
fi

if [ "$BUILD" = 1 ]; then
  cargo build --release -p tessera-loadgen -p tessera-server
fi
LOADGEN=${LOADGEN:-target/release/tessera-loadgen}
TESSERA=${TESSERA:-target/release/tessera}

# shellcheck source=scripts/bench-lib.sh
source scripts/bench-lib.sh

# shellcheck disable=SC2086 # MOCK_ARGS is a list of options
"$LOADGEN" mock-llm --port 0 --latency-ms "$LATENCY_MS" $MOCK_ARGS >"$WORK/mock.log" 2>&1 &
pids+=($!)
MOCK=$(wait_listening "$WORK/mock.log")

wal_lsn() {
  psql -qtA "$PG_URL" -c "SELECT pg_current_wal_lsn()"
}

db_size() {
  psql -qtA "$PG_URL" -c "SELECT pg_database_size(current_database())"
}

run_setup() {
  local setup=$1 run=$2 nodes store_url
  case $setup in
    sqlite) nodes=1 store_url="" ;;
    pg[1-9]) nodes=${setup#pg} store_url=$PG_URL ;;
    *) echo "unknown setup $setup" >&2; exit 1 ;;
  esac
  local out=$WORK/$setup-$run
  if [ -n "$store_url" ]; then
    psql -q "$PG_ADMIN_URL" -c "DROP DATABASE IF EXISTS $PG_DB" -c "CREATE DATABASE $PG_DB"
  fi
  local node_pids=() urls=() i
  for ((i = 1; i <= nodes; i++)); do
    local dir=$out/node$i
    mkdir -p "$dir"
    (
      export OPENAI_BASE_URL=http://$MOCK/v1 OPENAI_API_KEY=test
      export TESSERA_MESSAGES_PER_MINUTE=100000000 TESSERA_MESSAGES_PER_MINUTE_PER_TENANT=0
      export TESSERA_MAX_OPEN_CHATS_PER_TENANT=0 TESSERA_IDLE_TIMEOUT_S=600 RUST_LOG=warn
      export TESSERA_DATA_DIR=$dir/data
      if [ -n "$store_url" ]; then export TESSERA_STORE_URL=$store_url; fi
      if ((nodes > 1)); then
        # A subject prefix of its own per run: no limit bucket or ticket of an earlier run.
        export TESSERA_NATS_URL=$NATS_URL TESSERA_NODE_ID=bench-$i
        export TESSERA_NATS_PREFIX=bench$$r$run$setup
      fi
      ulimit -n "$(ulimit -Hn)"
      exec "$TESSERA" serve --bind 127.0.0.1:0
    ) >"$dir/server.log" 2>&1 &
    node_pids+=($!)
    pids+=($!)
    urls+=("http://$(wait_listening "$dir/server.log")")
  done
  local per_node=$((CHATS / nodes)) wal_before="" wal_after="" size_before=""
  if [ -n "$store_url" ]; then
    wal_before=$(wal_lsn)
    size_before=$(db_size)
  fi
  local gens=() peers=()
  if [ -n "$store_url" ]; then peers+=(--peer-comm postgres); fi
  if ((nodes > 1)); then peers+=(--peer-comm nats-server); fi
  for ((i = 0; i < nodes; i++)); do
    # CROSS=1: each generator's sockets go to the next node (chats followed across nodes).
    local ws=()
    if [ "${CROSS:-0}" = 1 ] && ((nodes > 1)); then ws=(--ws-url "${urls[$(((i + 1) % nodes))]}"); fi
    # shellcheck disable=SC2086 # RUN_ARGS is a list of options
    "$LOADGEN" run --url "${urls[$i]}" "${ws[@]}" --chats "$per_node" --turns "$TURNS" $RUN_ARGS \
      --server-pid "${node_pids[$i]}" "${peers[@]}" --json "$out/run$i.json" \
      >"$out/run$i.log" 2>&1 &
    gens+=($!)
  done
  local failed=0
  for pid in "${gens[@]}"; do
    wait "$pid" || failed=1
  done
  if ((failed)); then any_failed=1; fi
  # Each node's counters (hand-overs, live events published, chats owned) beside its log.
  for ((i = 0; i < nodes; i++)); do
    curl -fsS "${urls[$i]}/metrics" >"$out/node$((i + 1))/metrics.txt" 2>/dev/null || true
  done
  local wal_bytes=null kept_bytes=null
  if [ -n "$store_url" ]; then
    wal_after=$(wal_lsn)
    wal_bytes=$(psql -qtA "$PG_URL" -c "SELECT pg_wal_lsn_diff('$wal_after', '$wal_before')::BIGINT")
    kept_bytes=$(($(db_size) - size_before))
  fi
  # Every node's CPU since it started (creating and connecting the chats too, which the
  # window above leaves out): /proc/PID/stat fields 14 and 15, in clock ticks.
  local whole_ticks=0 ticks
  for pid in "${node_pids[@]}"; do
    ticks=$(awk '{print $14 + $15}' "/proc/$pid/stat" 2>/dev/null || echo 0)
    whole_ticks=$((whole_ticks + ticks))
  done
  local whole_cpu_s
  whole_cpu_s=$(awk -v t="$whole_ticks" -v hz="$(getconf CLK_TCK)" 'BEGIN {print t / hz}')
  # One summary of the run's load generators: CPU summed over nodes, a service's CPU from the
  # load generator that saw the most (their windows overlap), latency of the worst node.
  jq -s -c --arg setup "$setup" --argjson run "$run" --argjson wal "$wal_bytes" --argjson kept "$kept_bytes" \
    --argjson failed "$failed" --argjson whole_cpu "$whole_cpu_s" --arg load "$(cut -d' ' -f1-3 /proc/loadavg)" '
    (map(.turns_completed) | add) as $turns
    | def per_turn(f): if $turns > 0 then (f * 1000 / $turns * 1000 | round) / 1000 else null end;
    {setup: $setup, run: $run, load: $load, failed_check: ($failed == 1),
     chats: (map(.chats) | add), turns: $turns,
     turns_per_s: (map(.turns_per_s) | add),
     tessera_ms_per_turn: per_turn(map(.server_usage.cpu_s) | add),
     tessera_whole_run_ms_per_turn: per_turn($whole_cpu),
     postgres_ms_per_turn: (if .[0].peer_usage.postgres then
       per_turn(map(.peer_usage.postgres.cpu_s) | max) else null end),
     nats_ms_per_turn: (if .[0].peer_usage["nats-server"] then
       per_turn(map(.peer_usage["nats-server"].cpu_s) | max) else null end),
     tessera_written_KiB_per_turn: ((map(.server_usage.write_KiB_per_turn * .turns_completed)
       | add) / $turns * 100 | round / 100),
     wal_KiB_per_turn: (if $wal then ($wal / 1024 / $turns * 100 | round / 100) else null end),
     kept_KiB_per_turn: (if $kept then ($kept / 1024 / $turns * 100 | round / 100) else null end),
     turn_p50_ms: (map(.turn_latency.p50_ms) | max),
     turn_p99_ms: (map(.turn_latency.p99_ms) | max),
     ui_p50_ms: (map(.ui_round_trip.p50_ms // null) | max),
     ui_p99_ms: (map(.ui_round_trip.p99_ms // null) | max),
     peak_rss_MiB: (map(.server.peak_rss_MiB) | max),
     errors: (map(.errors | to_entries) | add | length)}' "$out"/run*.json \
    | tee -a "$WORK/results.jsonl" \
    | jq -r '"\(.setup) #\(.run): \(.turns_per_s) turns/s  tessera \(.tessera_ms_per_turn) ms/turn"
        + " (whole run \(.tessera_whole_run_ms_per_turn))"
        + "  postgres \(.postgres_ms_per_turn // "-") ms/turn  nats \(.nats_ms_per_turn // "-")"
        + " ms/turn  WAL \(.wal_KiB_per_turn // "-") KiB/turn  kept \(.kept_KiB_per_turn // "-")"
        + " KiB/turn  p50 \(.turn_p50_ms) p99"
        + " \(.turn_p99_ms) ms  UI p50 \(.ui_p50_ms // "-") p99 \(.ui_p99_ms // "-") ms"
        + "  RSS \(.peak_rss_MiB) MiB  load \(.load)"
        + (if .failed_check then "  (a load generator reported a failed check)" else "" end)'
  for pid in "${node_pids[@]}"; do
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
}

any_failed=0
for ((run = 1; run <= REPEAT; run++)); do
  for setup in $SETUPS; do
    run_setup "$setup" "$run"
  done
done
echo "logs and JSON summaries: $WORK"
# A failed check (a protocol violation, a chat that did not finish) fails the script.
exit "$any_failed"
