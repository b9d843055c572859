#!/usr/bin/env bash
# Paired benchmark runs (README "Performance"): alternates two `scripts/bench-sqlite.sh`
# settings, A then B, for PAIRS rounds, and reports B / A of each round plus their mean and a
# 95% interval. Not a test.
#
# WHY pairs: these VMs change speed by 10-40% over minutes (the same 1,000 x 10 run reads
# 0.52-0.63 ms per turn within one hour), so two means taken at different times compare the
# machine's phases more than the settings. A and B of one round run back to back, in the same
# phase; the ratio of each round is the measurement and its spread over rounds is the noise.
#
#   # the 100 ms ratio of issue 14: throughput at 100 ms over throughput at 0 ms
#   PAIRS=8 CHATS=3000 TURNS=20 A="LATENCY_MS=0" B="LATENCY_MS=100" scripts/bench-pairs.sh
#   # flatness: cost per turn at 10,000 chats over 100 chats
#   PAIRS=5 A="CHATS=100 ROUNDS=10" \
#     B="CHATS=10000 RUN_ARGS='--source-ips 127.0.0.2-127.0.0.5'" scripts/bench-pairs.sh
#   # two builds (copies of release binaries)
#   PAIRS=6 A="TESSERA=/tmp/base-tessera" B="TESSERA=/tmp/new-tessera" scripts/bench-pairs.sh
#
# A and B are shell assignments (quoted values allowed), applied on top of the environment:
# every other variable (CHATS, TURNS, LOADGEN, ...) goes to bench-sqlite.sh for both sides.
# Output (stdout): one JSON line per run, then one summary line:
#   {"summary":true,"pairs":N,"throughput_ratio":{"mean":..,"low":..,"high":..,"each":[..]},
#    "cpu_ratio":{...}}
# throughput_ratio = B's turns/s over A's; cpu_ratio = B's server CPU per turn over A's;
# turn_p99_ratio and ui_p99_ratio (UI runs only, else null) = B's p99 latency over A's.
# The interval is the mean +- t(0.975, N-1) x standard error; with N < 2 it is the mean.
set -euo pipefail
cd "$(dirname "$0")/.."

PAIRS=${PAIRS:-4}
A=${A:?"set A, e.g. A=\"LATENCY_MS=0\""}
B=${B:?"set B, e.g. B=\"LATENCY_MS=100\""}
command -v jq >/dev/null || { echo "needs jq" >&2; exit 1; }

# One run of bench-sqlite.sh with the assignments of one side; prints its summary line.
run_side() {
  local side=$1 assignments=$2 line
  line=$(eval "env $assignments scripts/bench-sqlite.sh" | tail -1)
  if ! jq -e '.turns_per_s > 0 and (.errors | length) == 0 and .protocol_violations == 0' \
    <<<"$line" >/dev/null; then
    echo "run $side ($assignments) failed or had errors: $line" >&2
    exit 1
  fi
  jq -c --arg side "$side" --arg with "$assignments" \
    '{side: $side, with: $with, turns_per_s, steady_turns_per_s, cpu_ms_per_turn,
      write_KiB_per_turn, kept_KiB_per_turn, turn_p50_ms, turn_p99_ms, ui_p50_ms, ui_p99_ms,
      threads}' <<<"$line"
}

results=$(mktemp /tmp/tessera-bench-pairs.XXXXXX)
for ((i = 1; i <= PAIRS; i++)); do
  run_side A "$A" | tee -a "$results"
  run_side B "$B" | tee -a "$results"
done

# Student's t at 0.975 for 1..30 degrees of freedom (beyond: 2.0).
jq -s -c --argjson pairs "$PAIRS" '
  def t975(df): [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
                 2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
                 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]
                | if df >= 1 and df <= 30 then .[df - 1] else 2.0 end;
  def round3: . * 1000 | round / 1000;
  def stats: (length) as $n | (add / $n) as $m
    | (if $n > 1 then (map(. - $m | . * .) | add / ($n - 1) | sqrt) * t975($n - 1) / ($n | sqrt)
       else 0 end) as $h
    | {mean: ($m | round3), low: ($m - $h | round3), high: ($m + $h | round3),
       each: map(round3)};
  [range(0; length; 2) as $i | {a: .[$i], b: .[$i + 1]}] as $rounds
  | {summary: true, pairs: $pairs,
     throughput_ratio: ($rounds | map(.b.turns_per_s / .a.turns_per_s) | stats),
     cpu_ratio: ($rounds | map(.b.cpu_ms_per_turn / .a.cpu_ms_per_turn) | stats),
     turn_p99_ratio: ($rounds | map(.b.turn_p99_ms / .a.turn_p99_ms) | stats),
     ui_p99_ratio: (if all($rounds[]; .a.ui_p99_ms != null and .b.ui_p99_ms != null)
                    then $rounds | map(.b.ui_p99_ms / .a.ui_p99_ms) | stats else null end),
     a_cpu_ms_per_turn: ($rounds | map(.a.cpu_ms_per_turn)),
     b_cpu_ms_per_turn: ($rounds | map(.b.cpu_ms_per_turn))}' "$results"
rm -f "$results"
