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
trap 'kill $npid $spid 2>/dev/null; wait $npid $spid 2>/dev/null; rm -rf "$tmp"' EXIT
i=0
until curl -sf "http://127.0.0.1:$SPORT/health" >/dev/null; do
    i=$((i + 1)); [ $i -gt 600 ] && { cat "$tmp/serve.log"; exit 1; }; sleep 0.1
done
cat >"$tmp/one_token.lua" <<'LUA'
wrk.method = "POST"
wrk.body = '{"prompt": "Hi", "max_tokens": 1, "temperature": 0}'
wrk.headers["Content-Type"] = "application/json"
LUA
# rps URL [wrk args...] -> "requests/s p50_ms"
rps() {
    url=$1; shift
    out=$(wrk -t2 -c"$CONNS" -d"${DURATION}s" --latency "$@" "$url")
    r=$(echo "$out" | awk '/^Requests\/sec/ {print $2}')
    p50=$(echo "$out" | awk '$1 == "50%" {print $2}')
    echo "$r $p50"
}
lat() { # p50 at one connection, in the unit wrk prints
    url=$1; shift
    wrk -t1 -c1 -d"${DURATION}s" --latency "$@" "$url" | awk '$1 == "50%" {print $2}'
}
set -- $(rps "http://127.0.0.1:$NPORT/"); ngx_rps=$1
set -- $(rps "http://127.0.0.1:$SPORT/health"); sf_health_rps=$1
set -- $(rps "http://127.0.0.1:$SPORT/v1/completions" -s "$tmp/one_token.lua"); sf_tok_rps=$1
ngx_p50=$(lat "http://127.0.0.1:$NPORT/")
sf_p50=$(lat "http://127.0.0.1:$SPORT/health")
sf_tok_p50=$(lat "http://127.0.0.1:$SPORT/v1/completions" -s "$tmp/one_token.lua")
ms() { echo "$1" | awk '{v=$1; if (v ~ /us$/) {sub(/us/,"",v); v/=1000} else if (v ~ /ms$/) {sub(/ms/,"",v)} else if (v ~ /s$/) {sub(/s/,"",v); v*=1000}; printf "%.3f", v}'; }
ngx_ms=$(ms "$ngx_p50"); sf_ms=$(ms "$sf_p50"); tok_ms=$(ms "$sf_tok_p50")
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
added=$(awk -v a="$sf_ms" -v b="$ngx_ms" 'BEGIN { printf "%.3f", a - b }')
echo "nginx static 200:          $ngx_rps req/s, p50 (1 conn) $ngx_ms ms"
echo "semflow GET /health:       $sf_health_rps req/s ($(ratio "$sf_health_rps" "$ngx_rps")x nginx), p50 (1 conn) $sf_ms ms"
echo "semflow 1-token completion: $sf_tok_rps req/s ($(ratio "$sf_tok_rps" "$ngx_rps")x nginx), p50 (1 conn) $tok_ms ms"
echo "gateway-added latency p50 (health vs nginx, 1 conn): $added ms"
cat <<MD

### $(date -u +%Y-%m-%d) gateway HTTP vs nginx ($(git rev-parse --short HEAD), $(nproc) cores, $WORKERS workers each)
\`sh bench/gateway/http_vs_nginx.sh\` (wrk -t2 -c$CONNS -d${DURATION}s; latency: wrk -t1 -c1)

| target | requests/s | ratio to nginx | p50 at 1 connection |
|---|---:|---:|---:|
| nginx 1.22 \`return 200\` | $ngx_rps | 1.00 | $ngx_ms ms |
| semflow \`GET /health\` | $sf_health_rps | $(ratio "$sf_health_rps" "$ngx_rps") | $sf_ms ms |
| semflow 1-token \`/v1/completions\` ($MODEL, CPU) | $sf_tok_rps | $(ratio "$sf_tok_rps" "$ngx_rps") | $tok_ms ms |

Gateway-added latency p50 (semflow /health minus nginx, one connection): $added ms.
MD
