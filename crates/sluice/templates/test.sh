#!/bin/sh
# The local test of {{name}}: builds it, serves it through a real gateway
# (`sluice run`) in front of the echo upstream (`sluice echo-upstream`, which
# answers every chat request with the request it received), and checks what
# each hook did. Run it with `make test`, or directly.
#
# Needs `sluice` on the PATH (or SLUICE=/path/to/sluice) and curl. The
# addresses are ECHO_ADDR, LISTEN and ADMIN, if the defaults are taken.
set -eu
cd "$(dirname "$0")"
NAME={{name}}
SLUICE=${SLUICE:-sluice}
ECHO_ADDR=${ECHO_ADDR:-127.0.0.1:19000}
LISTEN=${LISTEN:-127.0.0.1:18080}
ADMIN=${ADMIN:-127.0.0.1:19901}

${MAKE:-make} --no-print-directory "$NAME.wasm"

work=$(mktemp -d)
pids=""
cleanup() {
  for pid in $pids; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

fail() {
  echo "FAIL: $*" >&2
  echo "--- the gateway's log, last 20 lines ---" >&2
  tail -n 20 "$work/gateway.log" >&2 || true
  exit 1
}

# The config of config/$NAME.yaml, pointed at this build and this echo.
mkdir "$work/config"
sed -e "s|file: ../$NAME.wasm|file: $PWD/$NAME.wasm|" -e "s|127.0.0.1:9000|$ECHO_ADDR|" \
  "config/$NAME.yaml" >"$work/config/$NAME.yaml"
"$SLUICE" echo-upstream --listen "$ECHO_ADDR" 2>"$work/echo.log" &
pids="$pids $!"
SLUICE_LOG_FORMAT=text "$SLUICE" run --config "$work/config" --listen "$LISTEN" --admin "$ADMIN" 2>"$work/gateway.log" &
pids="$pids $!"

# Ready once the config is applied: the plugin is compiled and configured.
tries=0
until curl -fsS -o /dev/null "http://$ADMIN/readyz" 2>/dev/null; do
  tries=$((tries + 1))
  [ "$tries" -le 1200 ] || fail "the gateway was not ready within 120 s"
  sleep 0.1
done

# POSTs a chat request body; the status is printed, the response kept.
chat() {
  curl -sS -o "$work/body" -D "$work/head" -w '%{http_code}' "http://$LISTEN/v1/chat/completions" \
    -H 'content-type: application/json' -d "$1"
}
body_has() { grep -qF -- "$1" "$work/body"; }

# The echo's reply holds the request it received as a JSON string, so its
# quotes are escaped there.
status=$(chat '{"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Hello"}]}')
[ "$status" = 200 ] || fail "a chat request was answered $status: $(cat "$work/body")"
body_has '\"x-{{name}}\":\"hello\"' || fail "the upstream did not get the request header x-{{name}}: $(cat "$work/body")"
body_has '\"role\":\"system\"' && body_has '\"content\":\"You are a helpful assistant.\"' ||
  fail "the upstream did not get the system message: $(cat "$work/body")"
echo "ok - request hook: header x-{{name}} and the system message reached the upstream"
grep -qi '^x-{{name}}: hello' "$work/head" || fail "no response header x-{{name}}: $(cat "$work/head")"
echo "ok - response-head hook: the response has the header x-{{name}}"
body_has '"sluice_plugin":"{{name}}"' || fail "the body has no \"sluice_plugin\" member: $(cat "$work/body")"
echo "ok - response-body hook: the JSON body has \"sluice_plugin\": \"{{name}}\""

status=$(chat '{"model": "gpt-4o-mini", "stream": true, "messages": [{"role": "user", "content": "Hello"}]}')
[ "$status" = 200 ] || fail "a streamed chat request was answered $status: $(cat "$work/body")"
events=$(grep -c '^data: {' "$work/body" || true)
marked=$(grep -c '^data: {.*"sluice_plugin":"{{name}}"' "$work/body" || true)
[ "$events" -gt 0 ] && [ "$marked" = "$events" ] && grep -q '^data: \[DONE\]' "$work/body" ||
  fail "$marked of $events streamed events have the \"sluice_plugin\" member: $(cat "$work/body")"
echo "ok - response-chunk hook: each of the $events streamed events has \"sluice_plugin\""

status=$(chat '{"model": "gpt-4o-mini", "messages": "not a list"}')
[ "$status" = 400 ] && body_has invalid_messages || fail "a body without messages was answered $status: $(cat "$work/body")"
echo "ok - request hook: a body without messages is answered 400 invalid_messages"

# The gateway writes its log in batches.
tries=0
until grep -q "{{name}}: response ended" "$work/gateway.log"; do
  tries=$((tries + 1))
  [ "$tries" -le 50 ] || fail "the gateway's log has no \"{{name}}: response ended\""
  sleep 0.1
done
echo "ok - response-end hook: the gateway logged \"{{name}}: response ended\""
echo "PASS: {{name}}"
