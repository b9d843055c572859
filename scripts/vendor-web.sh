#!/usr/bin/env bash
# Vendors the web client's third-party JavaScript from npm at pinned versions, with licences.
#
#   scripts/vendor-web.sh          refresh the vendored files (needs node + npm)
#   scripts/vendor-web.sh --check  fail if the committed files differ from the pinned packages
#
# The client has no build step: these files are committed and embedded in the `tessera` binary
# (crates/tessera-server/src/web_client.rs), so `cargo run` needs no npm. axe-core is only for
# the browser tests (injected by integration-tests/tests/browser.rs), never served by the app.
set -euo pipefail
cd "$(dirname "$0")/.."

MARKED=18.2.1      # Markdown → HTML (MIT)
DOMPURIFY=3.4.18   # HTML sanitizer (Apache-2.0 OR MPL-2.0)
AXE=4.14.1         # accessibility checker, tests only (MPL-2.0)

APP=crates/tessera-server/static/vendor
TESTS=integration-tests/vendor

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
npm install --silent --no-audit --no-fund --ignore-scripts --prefix "$work" \
  "marked@$MARKED" "dompurify@$DOMPURIFY" "axe-core@$AXE" >/dev/null
m="$work/node_modules"

out="$work/out"
mkdir -p "$out/app" "$out/tests"
cp "$m/marked/lib/marked.esm.js" "$out/app/marked.esm.js"
cp "$m/marked/LICENSE" "$out/app/marked.LICENSE"
cp "$m/dompurify/dist/purify.es.mjs" "$out/app/purify.es.mjs"
cp "$m/dompurify/LICENSE" "$out/app/dompurify.LICENSE"
cp "$m/dompurify/LICENSE-MPL" "$out/app/dompurify.LICENSE-MPL"
cp "$m/axe-core/axe.min.js" "$out/tests/axe.min.js"
cp "$m/axe-core/LICENSE" "$out/tests/axe-core.LICENSE"
cp "$m/axe-core/LICENSE-3RD-PARTY.txt" "$out/tests/axe-core.LICENSE-3RD-PARTY.txt"
printf 'marked %s\ndompurify %s\n' "$MARKED" "$DOMPURIFY" > "$out/app/VERSIONS"
printf 'axe-core %s\n' "$AXE" > "$out/tests/VERSIONS"

if [[ "${1:-}" == "--check" ]]; then
  diff -r "$out/app" "$APP" && diff -r "$out/tests" "$TESTS" \
    || { echo "vendored web files differ from the pinned npm packages: run scripts/vendor-web.sh" >&2; exit 1; }
  echo "vendored web files match marked $MARKED, dompurify $DOMPURIFY, axe-core $AXE"
  exit 0
fi
rm -rf "$APP" "$TESTS"
mkdir -p "$APP" "$TESTS"
cp "$out/app/"* "$APP/"
cp "$out/tests/"* "$TESTS/"
echo "vendored marked $MARKED, dompurify $DOMPURIFY into $APP; axe-core $AXE into $TESTS"
