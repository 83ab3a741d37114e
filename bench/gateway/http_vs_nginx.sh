#!/bin/sh
# Gateway HTTP throughput and latency next to Debian's nginx on the same machine (wrk).
#   sh bench/gateway/http_vs_nginx.sh            (root: installs wrk and nginx-light if missing)
# Env: DURATION (s, default 10), CONNS (default 64), WORKERS (default 2), MODEL (default demo).
# Prints one line per measurement and a Markdown block for docs/PERFORMANCE.md.
set -e
cd "$(dirname "$0")/../.."
DURATION=${DURATION:-10}
CONNS=${CONNS:-64}
WORKERS=${WORKERS:-2}
MODEL=${MODEL:-demo}
BIN=${SEMFLOW_BIN:-build/semflow}
[ -x "$BIN" ] || { echo "build first: make" >&2; exit 1; }
if ! command -v wrk >/dev/null || ! command -v nginx >/dev/null; then
    [ "$(id -u)" = 0 ] || { echo "need wrk and nginx: apt-get install wrk nginx-light" >&2; exit 1; }
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk nginx-light >/dev/null
fi
tmp=$(mktemp -d)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
NPORT=$(free_port)
SPORT=$(free_port)
cat >"$tmp/nginx.conf" <<CONF
worker_processes $WORKERS;
daemon off;
pid $tmp/nginx.pid;
error_log $tmp/nginx.err;
events { worker_connections 4096; }
http {
    access_log off;
    server { listen 127.0.0.1:$NPORT reuseport; location / { return 200 "ok\n"; } }
}
CONF
nginx -c "$tmp/nginx.conf" -p "$tmp" &
npid=$!
"$BIN" serve --model "$MODEL" --port "$SPORT" --workers "$WORKERS" 2>"$tmp/serve.log" &
spid=$!
cleanup() { kill $npid $spid 2>/dev/null; wait $npid $spid 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
trap 'exit 1' HUP INT TERM PIPE  # through the EXIT trap: no server is left behind
i=0
until curl -sf "http://127.0.0.1:$SPORT/health" >/dev/null; do
    i=$((i + 1)); [ $i -gt 600 ] && { cat "$tmp/serve.log"; exit 1; }; sleep 0.1
done
cat >"$tmp/one_token.lua" <<'LUA'
wrk.method = "POST"
wrk.body = '{"prompt": "Hi", "max_tokens": 1, "temperature": 0}'
wrk.headers["Content-Type"] = "application/json"
LUA
# The machine is shared: every figure is the median of ROUNDS runs, with nginx and semflow
# interleaved so both see the same background load.
ROUNDS=${ROUNDS:-3}
median() { sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
ms() { awk '{v=$1; if (v ~ /us$/) {sub(/us/,"",v); v/=1000} else if (v ~ /ms$/) {sub(/ms/,"",v)} else if (v ~ /s$/) {sub(/s/,"",v); v*=1000}; printf "%.3f\n", v}'; }
rps() { url=$1; shift; wrk -t2 -c"$CONNS" -d"${DURATION}s" "$@" "$url" | awk '/^Requests\/sec/ {print $2}'; }
p50() { url=$1; shift; wrk -t1 -c1 -d"${DURATION}s" --latency "$@" "$url" | awk '$1 == "50%" {print $2}' | ms; }
NGX=http://127.0.0.1:$NPORT/
HEALTH=http://127.0.0.1:$SPORT/health
CMPL="http://127.0.0.1:$SPORT/v1/completions -s $tmp/one_token.lua"
: >"$tmp/r"
for r in $(seq "$ROUNDS"); do
    echo "ngx_rps $(rps $NGX)" >>"$tmp/r"
    echo "health_rps $(rps $HEALTH)" >>"$tmp/r"
    echo "tok_rps $(rps $CMPL)" >>"$tmp/r"
    echo "ngx_p50 $(p50 $NGX)" >>"$tmp/r"
    echo "health_p50 $(p50 $HEALTH)" >>"$tmp/r"
    curl -s "$HEALTH" >/dev/null; curl -s "http://127.0.0.1:$SPORT/metrics" >"$tmp/m0"
    echo "tok_p50 $(p50 $CMPL)" >>"$tmp/r"
    curl -s "http://127.0.0.1:$SPORT/metrics" >"$tmp/m1"
done
get() { awk -v k="$1" '$1 == k {print $2}' "$tmp/r" | median; }
ngx_rps=$(get ngx_rps); sf_health_rps=$(get health_rps); sf_tok_rps=$(get tok_rps)
ngx_ms=$(get ngx_p50); sf_ms=$(get health_p50); tok_ms=$(get tok_p50)
load=$(cut -d' ' -f1-3 /proc/loadavg)
# the server's own account of what it adds to each completion (outside the engine), over the
# last one-connection completion run: the difference of two scrapes of its histogram
set -- $(python3 - "$tmp/m0" "$tmp/m1" <<'PY'
import sys
def read(path):
    b, s, n = {}, 0.0, 0.0
    for l in open(path):
        if l.startswith("semflow_gateway_overhead_seconds_bucket"):
            le = l.split('le="')[1].split('"')[0]
            b[float("inf") if le == "+Inf" else float(le)] = float(l.split()[-1])
        elif l.startswith("semflow_gateway_overhead_seconds_sum"): s = float(l.split()[-1])
        elif l.startswith("semflow_gateway_overhead_seconds_count"): n = float(l.split()[-1])
    return b, s, n
b0, s0, n0 = read(sys.argv[1])
b1, s1, n1 = read(sys.argv[2])
n = n1 - n0
prev_le, prev_c, p50 = 0.0, 0.0, 0.0
for le in sorted(b1):
    c = b1[le] - b0.get(le, 0)
    if n and c >= n / 2:
        p50 = prev_le if le == float("inf") else prev_le + (le - prev_le) * (n / 2 - prev_c) / max(c - prev_c, 1)
        break
    prev_le, prev_c = le, c
print("%.3f %.3f %d" % (p50 * 1e3, ((s1 - s0) / n if n else 0) * 1e3, n))
PY
)
gw_p50=$1; gw_mean=$2; gw_n=$3
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
added=$(awk -v a="$sf_ms" -v b="$ngx_ms" 'BEGIN { printf "%.3f", a - b }')
echo "nginx static 200:           $ngx_rps req/s, p50 (1 conn) $ngx_ms ms"
echo "semflow GET /health:        $sf_health_rps req/s ($(ratio "$sf_health_rps" "$ngx_rps")x nginx), p50 (1 conn) $sf_ms ms"
echo "semflow 1-token completion: $sf_tok_rps req/s ($(ratio "$sf_tok_rps" "$ngx_rps")x nginx), p50 (1 conn) $tok_ms ms"
echo "gateway-added latency p50 (health vs nginx, 1 conn): $added ms; load average $load"
echo "gateway share of a completion at 1 connection (server histogram, $gw_n requests): p50 $gw_p50 ms, mean $gw_mean ms"
cat <<MD

### $(date -u +%Y-%m-%d) gateway HTTP vs nginx ($(git rev-parse --short HEAD), $(nproc) cores, $WORKERS workers each)
\`sh bench/gateway/http_vs_nginx.sh\` (wrk -t2 -c$CONNS -d${DURATION}s; latency: wrk -t1 -c1; median of $ROUNDS interleaved rounds; load average $load)

| target | requests/s | ratio to nginx | p50 at 1 connection |
|---|---:|---:|---:|
| nginx 1.22 \`return 200\` | $ngx_rps | 1.00 | $ngx_ms ms |
| semflow \`GET /health\` | $sf_health_rps | $(ratio "$sf_health_rps" "$ngx_rps") | $sf_ms ms |
| semflow 1-token \`/v1/completions\` ($MODEL, CPU) | $sf_tok_rps | $(ratio "$sf_tok_rps" "$ngx_rps") | $tok_ms ms |

Gateway-added latency p50 (semflow /health minus nginx, one connection): $added ms.
Gateway share of a 1-token completion at one connection (\`semflow_gateway_overhead_seconds\`:
arrival to submit plus engine done to response sent, $gw_n requests): p50 $gw_p50 ms, mean $gw_mean ms.
MD
