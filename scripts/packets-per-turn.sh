#!/usr/bin/env bash
# Benchmark recipe for README "Performance" (not a test): TCP packets per turn on loopback
# during one `scripts/bench-sqlite.sh` run, split by connection (client <-> server WebSocket,
# server <-> mock model) and by direction and kind (data, pure ACK, SYN/FIN/RST).
#
# WHY: a turn with 100 ms model latency costs more CPU than one at 0 ms although the server
# makes the same system calls (docs/performance-log.md, fourteenth and sixteenth sessions). The
# difference is packets: with the model slow, a turn's events and the model's answers no longer
# arrive in one burst, and the peers' delayed ACKs become packets of their own. These counts show
# where.
#
#   LATENCY_MS=0 scripts/packets-per-turn.sh                 # 300 chats x 10 turns
#   LATENCY_MS=100 scripts/packets-per-turn.sh
#   CHATS=3000 TURNS=20 LATENCY_MS=100 scripts/packets-per-turn.sh
#
# Output (stdout): the bench run's summary line, then one JSON line: {"turns": N,
# "per_turn": {"ws client->server data": .., "model mock->server ack": .., ...}}.
# The capture (headers only) stays in WORK/lo.pcap. Capturing costs CPU, so the run's own
# CPU and throughput figures are not comparable with other runs; the counts are.
# Needs root, tcpdump (`apt-get install tcpdump`), python3 and what bench-sqlite.sh needs.
set -euo pipefail
cd "$(dirname "$0")/.."

export CHATS=${CHATS:-300}
export TURNS=${TURNS:-10}
command -v tcpdump >/dev/null || { echo "needs tcpdump (apt-get install tcpdump)" >&2; exit 1; }
WORK=$(mktemp -d /tmp/tessera-packets.XXXXXX)
export WORK

# shellcheck source=scripts/bench-lib.sh
source scripts/bench-lib.sh

# Headers only (-s 96), unbuffered to the file (-U) so that stopping it loses nothing.
tcpdump -i lo -nn -U -s 96 -w "$WORK/lo.pcap" tcp 2>"$WORK/tcpdump.log" &
capture=$!
pids+=("$capture")
# tcpdump says "listening on lo" once it captures.
for _ in $(seq 50); do
  grep -q "listening on" "$WORK/tcpdump.log" && break
  kill -0 "$capture" 2>/dev/null || break
  sleep 0.1
done
if ! grep -q "listening on" "$WORK/tcpdump.log"; then
  echo "tcpdump did not start capturing (root needed?):" >&2
  cat "$WORK/tcpdump.log" >&2
  exit 1
fi
summary=$(scripts/bench-sqlite.sh | tail -1)
kill -INT "$capture"
wait "$capture" 2>/dev/null || true
echo "$summary"

server=$(wait_listening "$WORK/server.log")
server=${server##*:}
mock=$(wait_listening "$WORK/mock.log")
mock=${mock##*:}
turns=$(jq '.turns_completed' "$WORK/run.json")

tcpdump -nn -r "$WORK/lo.pcap" 2>/dev/null | python3 -c '
import collections, json, re, sys
server, mock, turns = sys.argv[1], sys.argv[2], int(sys.argv[3])
line_re = re.compile(r"IP \S+\.(\d+) > \S+\.(\d+): Flags \[([^\]]*)\].* length (\d+)")
counts = collections.Counter()
for line in sys.stdin:
    m = line_re.search(line)
    if not m:
        continue
    src, dst, flags, length = m.groups()
    if server in (src, dst):
        link = "ws"
        direction = "server->client" if src == server else "client->server"
    elif mock in (src, dst):
        link = "model"
        direction = "mock->server" if src == mock else "server->mock"
    else:
        continue
    if any(f in flags for f in "SFR"):
        kind = "syn/fin/rst"
    elif int(length) > 0:
        kind = "data"
    else:
        kind = "ack"
    counts[f"{link} {direction} {kind}"] += 1
per_turn = {k: round(v / turns, 3) for k, v in sorted(counts.items())}
per_turn["all"] = round(sum(counts.values()) / turns, 3)
print(json.dumps({"turns": turns, "per_turn": per_turn}))
' "$server" "$mock" "$turns"
