#!/usr/bin/env bash
# Runs the steps of deploy/Dockerfile without a Docker engine (CI has none), reading them from
# the Dockerfile itself so the two cannot drift:
#   1. every COPY source exists in the build context;
#   2. the build stage's `cargo build` command builds the binary (set IMAGE_PROFILE=release to
#      build exactly as the image does; the default debug profile reuses CI's test build);
#   3. the runtime layout (binary, workflows, config) is assembled under a temporary root, with
#      the image's ENV (paths moved under that root);
#   4. the image's CMD starts the server and the HEALTHCHECK command passes; SIGTERM stops it.
set -euo pipefail
cd "$(dirname "$0")/.."
dockerfile=deploy/Dockerfile

echo "-- COPY sources exist"
grep -E '^COPY ' "$dockerfile" | grep -v -- '--from=' | while read -r _ rest; do
  # All words but the last are sources.
  read -ra words <<<"$rest"
  for src in "${words[@]:0:${#words[@]}-1}"; do
    [ -e "$src" ] || { echo "COPY source missing: $src" >&2; exit 1; }
  done
done

echo "-- the runtime user is not root"
user=$(grep -E '^USER ' "$dockerfile" | tail -1 | awk '{print $2}')
case "${user%%:*}" in
  ""|0|root) echo "the image runs as root ($user)" >&2; exit 1 ;;
esac

echo "-- build step"
build=$(grep -E 'cargo build' "$dockerfile" | sed -E 's/^RUN //; s/ *\\$//')
profile=${IMAGE_PROFILE:-debug}
if [ "$profile" = release ]; then
  eval "$build"
else
  eval "${build/--release /}"
fi
bin="target/$profile/tessera"
[ -x "$bin" ] || { echo "no binary at $bin" >&2; exit 1; }

echo "-- runtime layout"
root=$(mktemp -d)
server_pid=""
cleanup() {
  if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; fi
  rm -rf "$root"
}
trap cleanup EXIT
mkdir -p "$root/usr/local/bin" "$root/etc/tessera" "$root/var/lib/tessera"
cp "$bin" "$root/usr/local/bin/tessera"
cp -r workflows "$root/etc/tessera/workflows"
cp deploy/tessera.toml "$root/etc/tessera/tessera.toml"
# ENV lines (with continuations) as KEY=VALUE words, absolute paths moved under $root.
env_words=$(sed -n '/^ENV /,/[^\\]$/p' "$dockerfile" | sed -E 's/^ENV //; s/\\$//' | tr -s ' ' '\n' | grep '=')
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
declare -a env_args=()
while read -r word; do
  key=${word%%=*}
  value=${word#*=}
  case "$value" in /*) value="$root$value" ;; esac
  # The container listens on 0.0.0.0:8080; here a free local port.
  [ "$key" = TESSERA_BIND ] && value="127.0.0.1:$port"
  env_args+=("$key=$value")
done <<<"$env_words"
cmd=$(grep -E '^CMD ' "$dockerfile" | python3 -c 'import json,sys; print(" ".join(json.loads(sys.stdin.read()[4:])))')

echo "-- CMD ($cmd) and HEALTHCHECK"
log="$root/server.log"
# shellcheck disable=SC2086 # the CMD words are split on purpose
env "${env_args[@]}" "$root/usr/local/bin/tessera" $cmd >"$log" 2>&1 &
server_pid=$!
health=$(grep -A1 '^HEALTHCHECK' "$dockerfile" | tail -1 | sed -E 's/^ *CMD //' \
  | python3 -c 'import json,sys; print(" ".join(json.loads(sys.stdin.read())))')
health=${health/127.0.0.1:8080/127.0.0.1:$port}
for _ in $(seq 1 200); do
  if $health >/dev/null 2>&1; then break; fi
  kill -0 "$server_pid" 2>/dev/null || { cat "$log" >&2; echo "the server exited" >&2; exit 1; }
  sleep 0.1
done
$health >/dev/null || { cat "$log" >&2; echo "the health check never passed" >&2; exit 1; }
grep -q '"level":"INFO"' "$log" || { cat "$log" >&2; echo "logs are not JSON (--log-format json)" >&2; exit 1; }
kill -TERM "$server_pid"
wait "$server_pid" || { cat "$log" >&2; echo "no clean exit on SIGTERM" >&2; exit 1; }
server_pid=""
echo "image steps ok"
