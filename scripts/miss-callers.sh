#!/usr/bin/env bash
# Benchmark recipe for README "Performance" (not a test): where a function's last-level cache
# misses come from, by caller, per turn. The server runs under callgrind with the same cache
# model as scripts/cache-misses.sh; then, for each pattern in FUNCS, the function matching it
# and its callers are printed with their (inclusive) last-level read / write misses per turn.
#
# WHY: cachegrind's totals move by a few misses per turn from run to run (which thread ran when
# changes what is cold), so a change worth ~10 misses cannot be told from them. A caller's
# inclusive misses in one place (the session's handlers growing a vector, say) are steadier.
#
#   scripts/miss-callers.sh                                  # 1,500 chats x 10 turns (~4 min)
#   FUNCS='__memcpy_avx_unaligned_erms' TOP=20 scripts/miss-callers.sh
#   TESSERA=/tmp/other-tessera scripts/miss-callers.sh      # another build
#
# The callgrind file stays in WORK (`callgrind_annotate --tree=caller WORK/callgrind.out`).
# Needs valgrind, python3 and what scripts/bench-sqlite.sh needs (a release build, jq).
set -euo pipefail
cd "$(dirname "$0")/.."

export CHATS=${CHATS:-1500}
export TURNS=${TURNS:-10}
export ROUNDS=${ROUNDS:-1}
TOP=${TOP:-10}
LL=${LL:-33554432,16,64}
# The functions whose callers to list: Python regexes, one per line, each matched against
# callgrind_annotate's function names (file:function).
FUNCS=${FUNCS:-'__memcpy_avx_unaligned_erms
raw_vec/mod.rs:alloc::raw_vec::RawVecInner<A>::finish_grow \['}
TESSERA_BIN=$(realpath "${TESSERA:-target/release/tessera}")
WORK=${WORK:-$(mktemp -d /tmp/tessera-miss-callers.XXXXXX)}
mkdir -p "$WORK"

command -v valgrind >/dev/null || { echo "needs valgrind (apt-get install valgrind)" >&2; exit 1; }
command -v python3 >/dev/null || { echo "needs python3" >&2; exit 1; }

cat >"$WORK/tessera-under-callgrind" <<WRAP
#!/usr/bin/env bash
exec valgrind --tool=callgrind --cache-sim=yes --LL=$LL --D1=32768,8,64 --I1=32768,8,64 \\
  --callgrind-out-file="$WORK/callgrind.out" "$TESSERA_BIN" "\$@"
WRAP
chmod +x "$WORK/tessera-under-callgrind"

TESSERA="$WORK/tessera-under-callgrind" WORK="$WORK" scripts/bench-sqlite.sh >"$WORK/bench.txt"
turns=$((CHATS * TURNS * ROUNDS))
callgrind_annotate --inclusive=yes --tree=caller --show=DLmr,DLmw --sort=DLmr \
  "$WORK/callgrind.out" >"$WORK/callers.txt"

python3 - "$WORK/callers.txt" "$turns" "$TOP" "$FUNCS" <<'PY'
import re, sys

path, turns, top, funcs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
lines = open(path).read().split("\n")
number = r"([\d,]+|\.)\s*(?:\([^)]*\))?"
value = lambda v: 0 if v == "." else int(v.replace(",", ""))
for line in lines:
    if "PROGRAM TOTALS" in line:
        m = re.match(r"\s*" + number + r"\s+" + number, line)
        if m:
            print(f"all: {value(m.group(1)) / turns:.1f} / {value(m.group(2)) / turns:.1f} "
                  f"last-level read / write misses per turn ({turns} turns)")
for pattern in filter(None, (p.strip() for p in funcs.split("\n"))):
    # In --tree=caller output a function's line has a '*'; the lines above it, up to a blank
    # one, are its callers ('<').
    found = [i for i, l in enumerate(lines) if "*" in l and re.search(pattern, l)]
    if not found:
        print(f"\n{pattern}: not found")
        continue
    i = found[0]
    m = re.match(r"\s*" + number + r"\s+" + number, lines[i])
    name = lines[i].split("*", 1)[1].strip()
    print(f"\n{value(m.group(1)) / turns:8.1f} {value(m.group(2)) / turns:8.1f}  {name[:150]}")
    callers = []
    j = i - 1
    while j >= 0 and lines[j].strip():
        c = re.match(r"\s*" + number + r"\s+" + number + r"\s+<\s+(.*)$", lines[j])
        if c:
            callers.append((value(c.group(1)) / turns, value(c.group(2)) / turns, c.group(3)))
        j -= 1
    for r, w, caller in sorted(callers, key=lambda c: -(c[0] + c[1]))[:top]:
        print(f"{r:8.1f} {w:8.1f}    < {caller.split(':', 1)[-1][:150]}")
PY
echo "callgrind output: $WORK/callgrind.out"
