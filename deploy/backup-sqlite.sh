#!/usr/bin/env bash
# Online backup of a single-node Tessera data dir (SQLite in WAL mode), safe while the server
# runs and writes: `sqlite3 .backup` copies a consistent snapshot through SQLite's backup API
# (copying tessera.db with cp while it is written is NOT safe: the WAL holds recent commits).
#
#   deploy/backup-sqlite.sh DATA_DIR BACKUP_DIR
#
# BACKUP_DIR must not exist yet. It becomes a complete data dir: the database plus the pinned
# workflow versions, checked with `PRAGMA integrity_check`. To restore, stop the server and
# start it with TESSERA_DATA_DIR (or data_dir) pointing at a copy of BACKUP_DIR.
set -euo pipefail

if [ $# -ne 2 ]; then
  echo "usage: $0 DATA_DIR BACKUP_DIR" >&2
  exit 2
fi
data_dir=$1
backup_dir=$2
db="$data_dir/tessera.db"

command -v sqlite3 >/dev/null || { echo "sqlite3 is needed (apt-get install sqlite3)" >&2; exit 1; }
[ -f "$db" ] || { echo "no database at $db" >&2; exit 1; }
[ ! -e "$backup_dir" ] || { echo "$backup_dir already exists; choose a new folder" >&2; exit 1; }

partial="$backup_dir.partial"
rm -rf "$partial"
mkdir -p "$partial"
# The server's busy timeout is 5 s; wait as long for its writer instead of failing at once.
sqlite3 -cmd ".timeout 5000" "$db" ".backup '$partial/tessera.db'"
# Everything else in the data dir (pinned workflow versions), without the live database files.
find "$data_dir" -mindepth 1 -maxdepth 1 ! -name 'tessera.db' ! -name 'tessera.db-*' \
  -exec cp -a {} "$partial/" \;
check=$(sqlite3 "$partial/tessera.db" "PRAGMA integrity_check;")
if [ "$check" != "ok" ]; then
  echo "integrity check of the backup failed: $check" >&2
  exit 1
fi
mv "$partial" "$backup_dir"
echo "backup of $data_dir written to $backup_dir ($(du -sh "$backup_dir" | cut -f1))"
