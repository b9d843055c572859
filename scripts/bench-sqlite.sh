#!/usr/bin/env bash
# Benchmark recipe for README "Performance" (not a test): one `tessera serve` on a fresh SQLite
# data dir, the mock LLM and `tessera-loadgen run` on this machine, then one JSON line with
# turns/s, server CPU per turn, bytes the server wrote per turn, bytes the database keeps per
# turn (its size after a final checkpoint) and the UI round trip.
#
#   scripts/bench-sqlite.sh                          # 1,000 chats x 10 turns, latency 0
#   CHATS=100 TURNS=10 scripts/bench-sqlite.sh
#   LATENCY_MS=100 scripts/bench-sqlite.sh
#   RUN_ARGS="--ui --think-ms 2000" scripts/bench-sqlite.sh
#   PROFILE=20 scripts/bench-sqlite.sh               # also `perf record` the server for 20 s
#   PROFILE=3 PROFILE_DELAY=0.5 PERF_ARGS="--call-graph dwarf" scripts/bench-sqlite.sh
#                                                    # a short run: start sooner, full stacks
#   WAL_PAGES=1 scripts/bench-sqlite.sh              # which tables/indexes each commit rewrites
#   KEEP_DATA=1 scripts/bench-sqlite.sh              # keep the database (e.g. for dbstat)
#   CHATS=100 ROUNDS=10 scripts/bench-sqlite.sh      # 10 runs of 100 chats on one server,
#                                                    # summed: a 100 x 10 run alone lasts ~0.2 s
#   cp target/release/tessera-loadgen /tmp/mockllm
#   MOCK_LLM=/tmp/mockllm RUN_ARGS="--peer-comm mockllm" scripts/bench-sqlite.sh
#                                                    # also the mock's CPU per turn (run.json)
#   SERVER_CPUS=0 PEER_CPUS=1 LATENCY_MS=100 scripts/bench-sqlite.sh
#                                                    # the server on one core, the peers on the
#                                                    # other (its CPU figures are its own)
#   MOCK_ARGS=--stream scripts/bench-sqlite.sh       # the mock streams one SSE event per word
#                                                    # (by default a whole answer in one event)
#   MOCK_ARGS="--stream --token-interval-ms 10" scripts/bench-sqlite.sh
#                                                    # ... one event every 10 ms, as a model
#                                                    # streams its tokens
#   TESSERA_DELTA_INTERVAL_MS=30 MOCK_ARGS="--stream --token-interval-ms 20 --answer-words 100" \
#     scripts/bench-sqlite.sh                        # 100-word answers, the deltas joined
#                                                    # (the server takes TESSERA_* from here)
#
# The database (and WAL_PAGES' copy of the WAL) is deleted at the end unless KEEP_DATA is set:
# a 10,000-chat run leaves ~0.5 GB, and a disk filled by runs fails everything else. Logs,
# run.json and perf.data stay in WORK.
#
# WAL_PAGES holds a read transaction open during the run, so checkpoints cannot restart the
# WAL and it keeps every page the run wrote; scripts/wal-pages.py then counts the WAL's
# frames by table and index (the CPU figures of such a run are not comparable).
#
# Needs a release build (`cargo build --release -p tessera-loadgen -p tessera-server`; not
# built here, so that a measurement never waits on a build) and `jq`; `sqlite3` for
# `kept_KiB_per_turn` (null without it).
set -euo pipefail
cd "$(dirname "$0")/.."

CHATS=${CHATS:-1000}
TURNS=${TURNS:-10}
LATENCY_MS=${LATENCY_MS:-0}
MOCK_ARGS=${MOCK_ARGS:-}
RUN_ARGS=${RUN_ARGS:-}
PROFILE=${PROFILE:-}
WAL_PAGES=${WAL_PAGES:-}
ROUNDS=${ROUNDS:-1}
KEEP_DATA=${KEEP_DATA:-}
WORK=${WORK:-$(mktemp -d /tmp/tessera-bench-sqlite.XXXXXX)}
LOADGEN=${LOADGEN:-target/release/tessera-loadgen}
TESSERA=${TESSERA:-target/release/tessera}
# The mock LLM runs from a copy of the load generator under another name when this is set, so
# `RUN_ARGS="--peer-comm NAME"` can report its CPU apart from the load generator's.
MOCK_LLM=${MOCK_LLM:-$LOADGEN}
# SERVER_CPUS / PEER_CPUS pin the server / the mock and the load generator to CPUs (taskset
# lists, e.g. SERVER_CPUS=0 PEER_CPUS=1), so that the server's CPU figures hold only its own
# work: on shared cores the peers' softirqs and timers are charged to whichever thread they
# interrupt (docs/performance-log.md, sixteenth session).
SERVER_CPUS=${SERVER_CPUS:-}
PEER_CPUS=${PEER_CPUS:-}
server_pin=()
peer_pin=()
[ -z "$SERVER_CPUS" ] || server_pin=(taskset -c "$SERVER_CPUS")
[ -z "$PEER_CPUS" ] || peer_pin=(taskset -c "$PEER_CPUS")

command -v jq >/dev/null || { echo "needs jq" >&2; exit 1; }

# shellcheck source=scripts/bench-lib.sh
source scripts/bench-lib.sh

# shellcheck disable=SC2086 # MOCK_ARGS is a list of flags
"${peer_pin[@]}" "$MOCK_LLM" mock-llm --port 0 --latency-ms "$LATENCY_MS" $MOCK_ARGS \
  >"$WORK/mock.log" 2>&1 &
pids+=($!)
MOCK=$(wait_listening "$WORK/mock.log")

OPENAI_BASE_URL="http://$MOCK/v1" OPENAI_API_KEY=test \
  TESSERA_MESSAGES_PER_MINUTE=100000000 TESSERA_MESSAGES_PER_MINUTE_PER_TENANT=1000000000 \
  TESSERA_MAX_OPEN_CHATS_PER_TENANT=0 TESSERA_IDLE_TIMEOUT_S=600 RUST_LOG=warn \
  TESSERA_DATA_DIR="$WORK/data" "${server_pin[@]}" "$TESSERA" serve --bind 127.0.0.1:0 \
  >"$WORK/server.log" 2>&1 &
SERVER_PID=$!
pids+=("$SERVER_PID")
SERVER=$(wait_listening "$WORK/server.log")

if [ -n "$WAL_PAGES" ]; then
  python3 -c 'import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN")
db.execute("SELECT count(*) FROM chats").fetchall()
time.sleep(3600)' "$WORK/data/tessera.db" &
  pids+=($!)
fi

if [ -n "$PROFILE" ]; then
  # Starts sampling a few seconds in, once the chats have connected and turns are running.
  perf_pid=""
  # shellcheck disable=SC2086 # PERF_ARGS is a list of flags
  (sleep "${PROFILE_DELAY:-5}" && perf record -e cpu-clock -F "${PERF_F:-999}" ${PERF_ARGS:--g} \
    -p "$SERVER_PID" -o "$WORK/perf.data" \
    -- sleep "$PROFILE" >"$WORK/perf.log" 2>&1) &
  perf_pid=$!
fi

round_files=()
for ((round = 1; round <= ROUNDS; round++)); do
  round_files+=("$WORK/run-$round.json")
  # shellcheck disable=SC2086 # RUN_ARGS is a list of flags
  "${peer_pin[@]}" "$LOADGEN" run --url "http://$SERVER" --chats "$CHATS" --turns "$TURNS" \
    --server-pid "$SERVER_PID" --json "$WORK/run-$round.json" $RUN_ARGS \
    2>"$WORK/run-$round.log" || {
    echo "load run failed; see $WORK/run-$round.log" >&2
    exit 1
  }
done
# One summary for all rounds: turns, CPU, writes, errors and protocol violations summed over
# every round's window (each window starts once that round's chats have connected); the
# other fields (latencies, memory, peer usage, steady_turns_per_s) are the last round's.
jq -s '.[-1] + {
  rounds: length,
  errors: (map(.errors | to_entries[]) | group_by(.key)
    | map({key: .[0].key, value: (map(.value) | add)}) | from_entries),
  protocol_violations: (map(.protocol_violations) | add),
  turns_completed: (map(.turns_completed) | add),
  turns_per_s: ((map(.turns_completed) | add) / (map(.window_s) | add) | floor),
  window_s: (map(.window_s) | add),
  round_cpu_ms_per_turn: map(.server_usage.cpu_ms_per_turn),
  server_usage: (.[-1].server_usage + {
    cpu_s: (map(.server_usage.cpu_s) | add),
    cpu_ms_per_turn: ((map(.server_usage.cpu_s) | add) * 1000 / (map(.turns_completed) | add)
      * 10000 | round / 10000),
    write_KiB_per_turn: ((map(.server_usage.write_KiB_per_turn * .turns_completed) | add)
      / (map(.turns_completed) | add) * 100 | round / 100)})}' \
  "${round_files[@]}" >"$WORK/run.json"

# Heartbeat pings the server sent over the whole run (null for a build without the metric).
pings=$(curl -s "http://$SERVER/metrics" | awk '$1 == "tessera_ws_pings_total" {print $2}')
# What the database keeps: its size once the WAL is checkpointed away (server stopped first).
kill "$SERVER_PID"
wait "$SERVER_PID" 2>/dev/null || true
if [ -n "$WAL_PAGES" ]; then
  cp "$WORK/data/tessera.db-wal" "$WORK/run.wal"
  kill "${pids[-1]}"
  python3 scripts/wal-pages.py "$WORK/data/tessera.db" "$WORK/run.wal" >&2
fi
db=$(find "$WORK/data" -name '*.sqlite3' -o -name '*.db' | head -1)
kept_kib=null
if [ -n "$db" ] && ! command -v sqlite3 >/dev/null; then
  echo "kept_KiB_per_turn: null (needs the sqlite3 command: apt-get install sqlite3)" >&2
fi
if [ -n "$db" ] && command -v sqlite3 >/dev/null; then
  sqlite3 "$db" 'PRAGMA wal_checkpoint(TRUNCATE);' >/dev/null
  turns_done=$(jq '.turns_completed' "$WORK/run.json")
  kept_kib=$(stat -c %s "$db" | awk -v t="$turns_done" '{printf "%.2f", $1 / 1024 / t}')
fi

jq -c --argjson kept "$kept_kib" --argjson pings "${pings:-null}" --arg work "$WORK" '{
  chats, turns_per_chat, rounds, turns_per_s, steady_turns_per_s, errors, protocol_violations,
  cpu_ms_per_turn: .server_usage.cpu_ms_per_turn, round_cpu_ms_per_turn,
  write_KiB_per_turn: .server_usage.write_KiB_per_turn,
  kept_KiB_per_turn: $kept,
  turn_p50_ms: .turn_latency.p50_ms, turn_p99_ms: .turn_latency.p99_ms,
  ui_p50_ms: .ui_round_trip.p50_ms, ui_p99_ms: .ui_round_trip.p99_ms, pings: $pings,
  threads: .server_usage.cpu_percent_by_thread, work: $work}' "$WORK/run.json"
if [ -z "$KEEP_DATA" ]; then
  rm -rf "$WORK/data" "$WORK/run.wal"
fi
if [ -n "$PROFILE" ]; then
  wait "$perf_pid" || true
  echo "profile: perf report -i $WORK/perf.data --sort comm,dso,sym --no-children" >&2
fi
