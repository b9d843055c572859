#!/usr/bin/env bash
# Benchmark recipe for README "Performance" (not a test): the server's last-level cache misses
# per turn, counted by cachegrind, and the functions they happen in.
#
# WHY: this VM has no hardware counters (`perf stat -e cache-misses` is "not supported"), and
# CPU time per turn moves by 10-15% with the machine's phase. Cachegrind simulates the caches
# instead: its counts per turn repeat within ~1% from run to run, so a change that touches fewer
# cache lines shows even where the CPU figures cannot tell it from noise. The simulated
# last-level cache defaults to this machine's L3 (32 MiB, 16-way).
#
#   scripts/cache-misses.sh                              # 2,000 chats x 10 turns (~2.5 min)
#   CHATS=100 ROUNDS=10 scripts/cache-misses.sh          # the same turns while the chats fit
#   TESSERA=/tmp/other-tessera scripts/cache-misses.sh   # another build
#   TOP=40 LL=8388608,16,64 scripts/cache-misses.sh      # more sites, a smaller cache
#   CHATS=1500 CALLERS=1 scripts/cache-misses.sh         # by caller, under callgrind (~4 min)
#   CALLERS='__memcpy_avx_unaligned_erms' TOP=20 scripts/cache-misses.sh
#   CHATS=300 SHOW=Ir CALLERS='tools::find \[' scripts/cache-misses.sh   # instructions instead
#
# Output: one line of totals per turn (Ir instructions; D1mr/DLmr first- and last-level read
# misses; D1mw/DLmw write misses), then the TOP functions by last-level misses per turn. The
# cachegrind file stays in WORK (`cg_annotate WORK/cachegrind.out`).
#
# With CALLERS the server runs under callgrind instead (same cache model), and for each of its
# patterns (Python regexes, one per line, matched against callgrind_annotate's file:function
# names; `1` for memcpy and vector growth) the matching function and its TOP callers are
# printed with their inclusive last-level read / write misses per turn. WHY: the totals move by
# a few misses per turn from run to run (which thread ran when changes what is cold), so a
# change worth ~10 misses cannot be told from them; a caller's misses in one place are steadier.
# The callgrind file stays in WORK (`callgrind_annotate --tree=caller WORK/callgrind.out`).
# SHOW=Ir ranks and prints instructions (inclusive, per turn) instead of the misses: where a
# turn's instructions go, by caller (twenty-fifth session).
#
# The server runs ~40x slower under cachegrind, so the load generator's clients see slow turns;
# the counts are per turn and do not depend on it. Needs valgrind (`apt-get install valgrind`),
# python3 and what scripts/bench-sqlite.sh needs (a release build, jq).
set -euo pipefail
cd "$(dirname "$0")/.."

export CHATS=${CHATS:-2000}
export TURNS=${TURNS:-10}
export ROUNDS=${ROUNDS:-1}
TOP=${TOP:-25}
LL=${LL:-33554432,16,64}
TESSERA_BIN=$(realpath "${TESSERA:-target/release/tessera}")
WORK=${WORK:-$(mktemp -d /tmp/tessera-cache-misses.XXXXXX)}
mkdir -p "$WORK"

command -v valgrind >/dev/null || { echo "needs valgrind (apt-get install valgrind)" >&2; exit 1; }
command -v python3 >/dev/null || { echo "needs python3" >&2; exit 1; }

CALLERS=${CALLERS:-}
SHOW=${SHOW:-DLmr,DLmw}
if [ "$CALLERS" = 1 ]; then
  CALLERS='__memcpy_avx_unaligned_erms
raw_vec/mod.rs:alloc::raw_vec::RawVecInner<A>::finish_grow \['
fi
tool=cachegrind
[ -n "$CALLERS" ] && tool=callgrind
# bench-sqlite.sh starts "$TESSERA serve ..."; this wrapper runs that under cachegrind
# (callgrind with CALLERS). `exec` keeps the pid, so the script's CPU and shutdown handling
# apply to the simulated server.
cat >"$WORK/tessera-under-$tool" <<EOF
#!/usr/bin/env bash
exec valgrind --tool=$tool --cache-sim=yes --LL=$LL --D1=32768,8,64 --I1=32768,8,64 \\
  --$tool-out-file="$WORK/$tool.out" "$TESSERA_BIN" "\$@"
EOF
chmod +x "$WORK/tessera-under-$tool"

TESSERA="$WORK/tessera-under-$tool" WORK="$WORK" scripts/bench-sqlite.sh >"$WORK/bench.txt"
turns=$((CHATS * TURNS * ROUNDS))

if [ -n "$CALLERS" ]; then
  callgrind_annotate --inclusive=yes --tree=caller --show="$SHOW" --sort="${SHOW%%,*}" \
    "$WORK/callgrind.out" >"$WORK/callers.txt"
  python3 - "$WORK/callers.txt" "$turns" "$TOP" "$CALLERS" "$SHOW" <<'PY'
import re, sys

path, turns, top, funcs, show = sys.argv[1:6]
turns, top, shown = int(turns), int(top), show.split(",")
lines = open(path).read().split("\n")
number = r"([\d,]+|\.)\s*(?:\([^)]*\))?"
numbers = r"\s*" + r"\s+".join([number] * len(shown))
value = lambda v: 0 if v == "." else int(v.replace(",", ""))
per_turn = lambda m: [value(g) / turns for g in m.groups()[: len(shown)]]
cells = lambda values: " ".join(f"{v:10.1f}" for v in values)
for line in lines:
    if "PROGRAM TOTALS" in line:
        m = re.match(numbers, line)
        if m:
            print(f"all: {cells(per_turn(m))} {' / '.join(shown)} per turn ({turns} turns)")
for pattern in filter(None, (p.strip() for p in funcs.split("\n"))):
    # In --tree=caller output a function's line has a '*'; the lines above it, up to a blank
    # one, are its callers ('<').
    found = [i for i, l in enumerate(lines) if "*" in l and re.search(pattern, l)]
    if not found:
        print(f"\n{pattern}: not found")
        continue
    i = found[0]
    m = re.match(numbers, lines[i])
    name = lines[i].split("*", 1)[1].strip()
    print(f"\n{cells(per_turn(m))}  {name[:150]}")
    callers = []
    j = i - 1
    while j >= 0 and lines[j].strip():
        c = re.match(numbers + r"\s+<\s+(.*)$", lines[j])
        if c:
            callers.append((per_turn(c), c.group(len(shown) + 1)))
        j -= 1
    for values, caller in sorted(callers, key=lambda c: -sum(c[0]))[:top]:
        print(f"{cells(values)}    < {caller.split(':', 1)[-1][:150]}")
PY
  echo "callgrind output: $WORK/callgrind.out"
  exit 0
fi

python3 - "$WORK/cachegrind.out" "$turns" "$TOP" <<'EOF'
import re, subprocess, sys

path, turns, top = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
events, summary = None, None
for line in open(path):
    if line.startswith("events:"):
        events = line.split()[1:]
    elif line.startswith("summary:"):
        summary = [int(v) for v in line.split()[1:]]
if not events or not summary:
    sys.exit(f"no summary in {path}: did the server exit normally?")
totals = dict(zip(events, summary))
print("per turn ({} turns): ".format(turns) + ", ".join(
    f"{name} {totals[name] / turns:.1f}"
    for name in ("Ir", "D1mr", "DLmr", "D1mw", "DLmw")
    if name in totals))

out = subprocess.run(
    ["cg_annotate", "--auto=no", "--show=DLmr,DLmw", "--threshold=0", path],
    capture_output=True, text=True, check=True).stdout
number = r"([\d,]+|\.)(?:\s+\([^)]*\))?"
rows = []
in_table = False
for line in out.splitlines():
    # The function table follows its "file:function" header.
    if line.rstrip().endswith("file:function"):
        in_table = True
        continue
    m = in_table and re.match(r"\s*" + number + r"\s+" + number + r"\s+(\S.*)$", line)
    if not m or "PROGRAM TOTALS" in line:
        continue
    value = lambda v: 0 if v == "." else int(v.replace(",", ""))
    rows.append((value(m.group(1)), value(m.group(2)), m.group(3)))
rows.sort(key=lambda r: r[0] + r[1], reverse=True)
print(f"{'DLmr/turn':>10} {'DLmw/turn':>10}  function")
for r, w, name in rows[:top]:
    print(f"{r / turns:10.1f} {w / turns:10.1f}  {name.split(':', 1)[-1][:150]}")
EOF
echo "cachegrind output: $WORK/cachegrind.out"
