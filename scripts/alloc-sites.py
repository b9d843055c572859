#!/usr/bin/env python3
"""Allocations per turn by call site, from heaptrack's stacks (scripts/alloc-sites.sh).

usage: alloc-sites.py STACKS TURNS [TOP]

STACKS is `heaptrack_print --flamegraph-cost-type allocations -F STACKS` output: one line per
distinct stack, frames joined by ';' (outermost first, each `name (file.rs)`), then the number
of allocation calls. Each stack is charged to its innermost frame in one of Tessera's own
source files (inlined frames carry only their file's base name), paired with the innermost
frame below it that is not the allocator or a standard collection: where in Tessera, and what
it called that allocated. Prints the TOP sites (default 40) and the total, per turn.
"""
import collections
import pathlib
import re
import subprocess
import sys

# Base names shared with dependencies (actix, hyper, serde_json, ...): a frame in one of these
# is not known to be ours.
AMBIGUOUS = {
    "lib.rs", "mod.rs", "error.rs", "client.rs", "server.rs", "http.rs", "json.rs", "types.rs",
    "run.rs", "time.rs", "log.rs", "config.rs", "store.rs", "load.rs", "context.rs",
    "registry.rs", "tool.rs", "tools.rs", "model.rs", "models.rs", "convert.rs", "format.rs",
    "wire.rs", "events.rs", "transport.rs", "main.rs", "sse.rs", "lease.rs", "status.rs",
    "schema.rs", "metrics.rs", "batch.rs", "writer.rs", "rows.rs", "reads.rs", "writes.rs",
    "limits.rs", "usage.rs", "routing.rs", "pending.rs", "tasks.rs", "ui.rs", "restore.rs",
    "report.rs", "args.rs", "mock.rs", "bus.rs", "engine.rs", "envelope.rs",
}
# Frames below the call site that only pass the request on to the allocator.
PLUMBING_FILES = (
    "raw_vec", "alloc.rs", "boxed.rs", "vec", "mod.rs", "string.rs", "slice.rs", "heaptrack",
)


def own_files(repo: pathlib.Path) -> set:
    names = {p.name for p in (repo / "crates").glob("*/src/**/*.rs")}
    return names - AMBIGUOUS


def demangled(frames: list) -> dict:
    """frame -> (short demangled name, file)."""
    parts = []
    for frame in frames:
        m = re.match(r"^(.*?)(?: \(([^)]*)\))?$", frame)
        parts.append((m.group(1), m.group(2) or ""))
    text = subprocess.run(
        ["c++filt"], input="\n".join(p[0] for p in parts), capture_output=True, text=True,
        check=True,
    ).stdout.split("\n")
    return {
        frame: (re.sub(r"\[[0-9a-f]{16}\]", "", name)[:90], file)
        for frame, (_, file), name in zip(frames, parts, text)
    }


def main() -> None:
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    path, turns = sys.argv[1], float(sys.argv[2])
    top = int(sys.argv[3]) if len(sys.argv) > 3 else 40
    ours = own_files(pathlib.Path(__file__).resolve().parent.parent)
    rows, frames = [], set()
    with open(path) as f:
        for line in f:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if not count.isdigit():
                continue
            fs = [frame for frame in stack.split(";") if frame]
            rows.append((fs, int(count)))
            frames.update(fs)
    names = demangled(sorted(frames))
    by_site = collections.Counter()
    total = 0
    for fs, count in rows:
        total += count
        stack = [names[f] for f in fs]
        own = [i for i, (_, file) in enumerate(stack) if file in ours]
        if not own:
            by_site["(outside Tessera's files) " + " < ".join(n for n, _ in stack[-3:])] += count
            continue
        i = own[-1]
        site = f"{stack[i][0]} ({stack[i][1]})"
        callee = next(
            (f"{n} ({file})" for n, file in reversed(stack[i + 1:])
             if not file.startswith(PLUMBING_FILES) and not n.startswith("0x")),
            "",
        )
        by_site[f"{site}  ->  {callee}" if callee else site] += count
    print(f"{total / turns:8.1f}  allocation calls per turn in all ({total} over {turns:.0f} turns)")
    for site, count in by_site.most_common(top):
        print(f"{count / turns:8.2f}  {site[:200]}")


if __name__ == "__main__":
    main()
