#!/usr/bin/env bash
# Installs the official AG-UI TypeScript client (pinned by integration-tests/agui-client's
# package-lock.json) that integration-tests/tests/agui.rs drives the AG-UI endpoint with.
# Idempotent: does nothing when the pinned packages are already installed.
set -euo pipefail
cd "$(dirname "$0")/../integration-tests/agui-client"
if [ -f node_modules/@ag-ui/client/package.json ] && [ node_modules/.package-lock.json -nt package-lock.json ]; then
  exit 0
fi
npm ci --no-audit --no-fund --loglevel=error
