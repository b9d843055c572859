#!/usr/bin/env bash
# Allocations per turn by call site (README "Performance"): one `scripts/bench-sqlite.sh` run of
# a server under heaptrack, then `scripts/alloc-sites.py` over its stacks. Where
# `scripts/alloc-count.sh` says how many allocations a turn makes, this says where they are.
# Not a timing: heaptrack makes the server several times slower. Nor a count to compare builds
# with: it counts C allocations too (SQLite's), and the slowed server batches differently (two
# runs of builds 28 allocations a turn apart read 361.7 and 361.3 in all, the sites spread
# ~8% apart). Compare builds with alloc-count.sh; read the sites here.
#
#   cargo build --release -p tessera-server --features system-allocator
#   cp target/release/tessera /tmp/tessera-sysalloc      # then rebuild without the feature
#   TESSERA=/tmp/tessera-sysalloc scripts/alloc-sites.sh # 300 chats x 10 turns
#   TESSERA=/tmp/tessera-sysalloc CHATS=1000 TOP=80 scripts/alloc-sites.sh
#
# heaptrack sees only the system allocator, hence the feature (mimalloc is the binary's
# allocator otherwise). Needs heaptrack and heaptrack_print (Debian: heaptrack), c++filt
# (binutils), python3 and jq. Other variables go to bench-sqlite.sh (TURNS, LOADGEN, ...);
# heap.zst and stacks.txt stay in WORK.
set -euo pipefail
cd "$(dirname "$0")/.."

for tool in heaptrack heaptrack_print c++filt python3 jq; do
  command -v "$tool" >/dev/null || { echo "needs $tool" >&2; exit 1; }
done
[ -n "${TESSERA:-}" ] || {
  echo "set TESSERA to a build with --features system-allocator (see the top of $0)" >&2
  exit 1
}
TESSERA=$(realpath "$TESSERA")
export CHATS=${CHATS:-300}
TOP=${TOP:-40}
WORK=$(mktemp -d /tmp/tessera-alloc-sites.XXXXXX)

# The server as bench-sqlite.sh starts it, under heaptrack.
cat >"$WORK/server" <<EOF
#!/usr/bin/env bash
exec heaptrack -o "$WORK/heap" "$TESSERA" "\$@"
EOF
chmod +x "$WORK/server"

TESSERA="$WORK/server" WORK="$WORK" scripts/bench-sqlite.sh >"$WORK/bench.json"
turns=$(jq '.turns_completed' "$WORK/run.json")
heap=$(ls "$WORK"/heap.*)
heaptrack_print -f "$heap" -F "$WORK/stacks.txt" --flamegraph-cost-type allocations >/dev/null
calls=$(awk '{n += $NF} END {print n + 0}' "$WORK/stacks.txt")
if [ "$calls" -lt $((turns * 10)) ]; then
  echo "heaptrack saw $calls allocations for $turns turns: is $TESSERA built with" \
    "--features system-allocator?" >&2
  exit 1
fi
python3 scripts/alloc-sites.py "$WORK/stacks.txt" "$turns" "$TOP"
echo "(heap profile and stacks in $WORK)"
