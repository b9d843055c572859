#!/usr/bin/env bash
# Allocations per turn (README "Performance"): uprobes on mimalloc's entry points of a release
# server, counted by `perf stat` over one `scripts/bench-sqlite.sh` run, chat creation included.
# The one per-turn figure these noisy machines repeat to ±1: compare builds with it, not with a
# single CPU reading. Not a timing: uprobes make the server several times slower.
#
#   scripts/alloc-count.sh                          # 1,000 chats x 10 turns
#   TESSERA=/tmp/copy-of-tessera CHATS=300 scripts/alloc-count.sh
#
# Prints one JSON line: malloc / zalloc / realloc per turn. Needs root (uprobes), perf and jq;
# the probes are removed on exit. Other variables go to bench-sqlite.sh (CHATS, TURNS, ...).
set -euo pipefail
cd "$(dirname "$0")/.."

command -v perf >/dev/null || { echo "needs perf" >&2; exit 1; }
TESSERA=$(realpath "${TESSERA:-target/release/tessera}")
WORK=$(mktemp -d /tmp/tessera-alloc-count.XXXXXX)
group="tessera_alloc_$$"
trap 'perf probe -q -d "$group:*" >/dev/null 2>&1 || true' EXIT

events=""
for fn in malloc zalloc realloc; do
  perf probe -q -x "$TESSERA" -a "$group:${fn}_$$=mi_${fn}_aligned"
  events+=" -e $group:${fn}_$$"
done

# The server as bench-sqlite.sh starts it, counted from (almost) its first instruction: perf
# attaches to this shell's pid, which `exec` hands to the server.
cat >"$WORK/server" <<EOF
#!/usr/bin/env bash
perf stat -x, $events -p \$\$ -o "$WORK/counts.csv" &
sleep 0.5 # perf attaches to the pid before the exec; counts before that are startup only
exec "$TESSERA" "\$@"
EOF
chmod +x "$WORK/server"

TESSERA="$WORK/server" WORK="$WORK" scripts/bench-sqlite.sh >"$WORK/bench.json"
# perf stat writes its counts once the server has exited.
for _ in $(seq 50); do
  grep -q realloc "$WORK/counts.csv" 2>/dev/null && break
  sleep 0.1
done
turns=$(jq '.turns_completed' "$WORK/run.json")
awk -F, -v turns="$turns" -v group="$group:" '
  NF > 2 && $1 ~ /^[0-9]+$/ {
    name = $3; sub(group, "", name); sub(/_[0-9]+$/, "", name)
    out = out sprintf("%s\"%s_per_turn\":%.1f", sep, name, $1 / turns); sep = ","
  }
  END { printf "{\"turns\":%d,%s}\n", turns, out }' "$WORK/counts.csv"
