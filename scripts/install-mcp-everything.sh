#!/usr/bin/env bash
# Installs the MCP reference server `@modelcontextprotocol/server-everything` at a pinned
# version into target/mcp-everything (ignored by git), for tessera-mcp's interop tests
# (crates/tessera-mcp/tests/everything.rs). Needs node 18+ and npm; `cargo run` never needs it.
set -euo pipefail
cd "$(dirname "$0")/.."

EVERYTHING=2026.8.31
DEST=target/mcp-everything

mkdir -p "$DEST"
npm install --silent --no-audit --no-fund --ignore-scripts --prefix "$DEST" \
  "@modelcontextprotocol/server-everything@$EVERYTHING" >/dev/null
echo "installed @modelcontextprotocol/server-everything $EVERYTHING into $DEST"
