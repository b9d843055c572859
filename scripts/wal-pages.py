#!/usr/bin/env python3
"""Counts the frames of a SQLite WAL file by the table or index each page belongs to: what
each group commit rewrites (see scripts/bench-sqlite.sh, WAL_PAGES=1).

    scripts/wal-pages.py DATABASE [WAL]     # WAL defaults to DATABASE-wal

Needs the sqlite3 command-line shell with the dbstat table (Debian's has it)."""
import collections
import struct
import subprocess
import sys

database = sys.argv[1]
wal = open(sys.argv[2] if len(sys.argv) > 2 else database + "-wal", "rb").read()
page_size = struct.unpack(">I", wal[8:12])[0]
salts = wal[16:24]
owner = {}
pages = subprocess.run(
    ["sqlite3", database, "SELECT pageno, name FROM dbstat"],
    capture_output=True, text=True, check=True,
).stdout
for line in pages.splitlines():
    number, name = line.split("|", 1)
    owner[int(number)] = name
frames, commits, by_owner = 0, 0, collections.Counter()
offset = 32
while offset + 24 + page_size <= len(wal):
    page, size_after_commit = struct.unpack(">II", wal[offset:offset + 8])
    if wal[offset + 8:offset + 16] != salts:
        break  # left over from before the WAL last started over
    by_owner[owner.get(page, "(free or new)")] += 1
    frames += 1
    commits += size_after_commit != 0
    offset += 24 + page_size
print(f"page size {page_size}, {frames} frames, {commits} commits, "
      f"{frames / max(commits, 1):.1f} frames per commit")
for name, count in by_owner.most_common():
    print(f"{name:32} {count:9} {count / max(frames, 1) * 100:5.1f}%")
