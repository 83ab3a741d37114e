#!/bin/sh
# The web dashboard in headless Chromium (Debian's chromium driven by playwright-core from
# web/node_modules): served by `semflow top --listen`, its numbers must change as PCIe copies
# (through the fake libcuda) and socket traffic flow. The browser part is test_dashboard.mjs.
BIN=${SEMFLOW_BIN:-build/semflow}
B=${SF_BUILD:-build}
LIB="$(cd "$(dirname "$B/tests/fixtures/libcuda.so.1")" 2>/dev/null && pwd)/libcuda.so.1"
CHROMIUM=${CHROMIUM:-$(command -v chromium || command -v chromium-browser)}
for need in node "$CHROMIUM"; do
    command -v "$need" >/dev/null 2>&1 || { echo "FAIL: dashboard_setup: $need not found (make deps installs nodejs and chromium)"; exit 1; }
done
[ -d web/node_modules/playwright-core ] || { echo "FAIL: dashboard_setup: web/node_modules/playwright-core missing (make runs npm ci in web/; offline?)"; exit 1; }
[ -f "$LIB" ] || { echo "FAIL: dashboard_setup: $LIB missing (make builds it)"; exit 1; }

log=$(mktemp)
"$BIN" top --listen 127.0.0.1:0 --no-discover --lib "$LIB" 2>"$log" &
top=$!
port=
for i in $(seq 300); do  # 30 s: BPF load and uprobe attach on a loaded host
    port=$(sed -n 's/.*dashboard on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$log")
    [ -n "$port" ] && break
    kill -0 $top 2>/dev/null || break
    sleep 0.1
done
if [ -z "$port" ]; then
    echo "FAIL: dashboard_setup: semflow top --listen did not start: $(cat "$log")"
    kill $top 2>/dev/null; rm -f "$log"; exit 1
fi
echo "PASS: dashboard_server_up"
CHROMIUM="$CHROMIUM" FAKE_CUDA="$LIB" timeout 120 node tests/integration/test_dashboard.mjs "http://127.0.0.1:$port"
rc=$?
kill $top 2>/dev/null
wait $top 2>/dev/null
rm -f "$log"
exit $rc
