#!/bin/sh
# Mixed-priority overload ladder (issue 6, item 3): a realtime-chat class (tenant A, urgency=high,
# max-latency=400ms, short prompts) and a batch-summarize class (tenant B, urgency=low,
# min-throughput=50tokens/sec, long prompts), Poisson arrivals, against one `semflow serve`.
#
#   sh bench/overload/run.sh [OUTDIR]        (default OUTDIR: build/overload)
#
# 1. Search: Poisson rates from SEARCH_RATES, ascending, with priorities on; a rate is sustained
#    when at least GOOD_SHARE of the requests issued met the SLO (loadgen's goodput under --slo).
#    The search stops at the first rate that misses, then tries the midpoint once.
#    The sustained rate R is the highest one that held.
# 2. Ladder: LEVELS x R (default 1 2 4 8), once with priorities on (scenario_on.json) and once off
#    (scenario_off.json: both classes send urgency=normal and no max-latency, so the scheduler orders
#    them by arrival alone, i.e. FCFS; tenants, keys, prompts and lengths are the same).
# 3. Every run's loadgen report goes to OUTDIR/<on|off>-<level>x.json (search runs: search-<rate>.json),
#    the rate R to OUTDIR/sustained_rate, the server log to OUTDIR/serve.log.
# Then: python3 bench/overload/plot.py OUTDIR  (picture and table).
#
# Env: MODEL (demo), BACKEND (auto), SERVE_ARGS (extra `semflow serve` flags, e.g. --threads 2),
#      QUEUE_LIMIT (per-lane queue before 429, default 16), SLO (default ttft=400ms,tpot=20ms:
#      the realtime latency target and 50 tokens/s), GOOD_SHARE (0.9), SEARCH_RATES ("0.5 1 2 4 8"),
#      SEARCH_DURATION (s, 15), DURATION (s per ladder run, 20), LEVELS ("1 2 4 8"), SEED (1).
set -e
cd "$(dirname "$0")/../.."
OUT=${1:-build/overload}
MODEL=${MODEL:-demo}
BACKEND=${BACKEND:-auto}
QUEUE_LIMIT=${QUEUE_LIMIT:-16}
SLO=${SLO:-ttft=400ms,tpot=20ms}
GOOD_SHARE=${GOOD_SHARE:-0.9}
SEARCH_RATES=${SEARCH_RATES:-0.5 1 2 4 8}
SEARCH_DURATION=${SEARCH_DURATION:-15}
DURATION=${DURATION:-20}
LEVELS=${LEVELS:-1 2 4 8}
SEED=${SEED:-1}
BIN=${SEMFLOW_BIN:-build/semflow}
DIR=bench/overload
[ -x "$BIN" ] || { echo "run.sh: $BIN not found; build first: make" >&2; exit 1; }
mkdir -p "$OUT"
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
URL=http://127.0.0.1:$PORT
# shellcheck disable=SC2086  # SERVE_ARGS is a list of flags
"$BIN" serve --model "$MODEL" --backend "$BACKEND" --port "$PORT" --tenants "$DIR/tenants.json" \
    --queue-limit "$QUEUE_LIMIT" --bpf off $SERVE_ARGS 2>"$OUT/serve.log" &
spid=$!
cleanup() { kill $spid 2>/dev/null; wait $spid 2>/dev/null || true; }
trap cleanup EXIT
trap 'exit 1' HUP INT TERM PIPE  # through the EXIT trap: the server is not left behind
i=0
until curl -sf "$URL/health" >/dev/null; do
    i=$((i + 1))
    if [ $i -gt 1200 ] || ! kill -0 $spid 2>/dev/null; then
        echo "run.sh: the server did not become healthy; its log:" >&2; tail -20 "$OUT/serve.log" >&2; exit 1
    fi
    sleep 0.1
done

# loadgen SCENARIO RATE DURATION JSON: one open-loop run, bounded by time (the request cap is
# twice the expected count, so the duration is what ends the run).
loadgen() {
    n=$(python3 -c "import math; print(int(math.ceil($2 * $3 * 2)) + 10)")
    "$BIN" loadgen --url "$URL" --scenario "$1" --rate "$2" --duration "$3" --num-requests "$n" \
        --slo "$SLO" --seed "$SEED" --timeout 120 --json "$4" >"$4.txt"
}
# share JSON: the share of issued requests that met the SLO.
share() {
    python3 -c 'import json,sys; a=json.load(open(sys.argv[1]))["all"]
d=json.load(open(sys.argv[1]))["duration_s"]
print("%.3f" % (a["goodput"] * d / a["issued"] if a["issued"] else 0))' "$1"
}
held() { python3 -c "import sys; sys.exit(0 if $1 >= $GOOD_SHARE else 1)"; }

best=""
miss=""
for r in $SEARCH_RATES; do
    loadgen "$DIR/scenario_on.json" "$r" "$SEARCH_DURATION" "$OUT/search-$r.json"
    s=$(share "$OUT/search-$r.json")
    echo "search: rate $r req/s: $s of requests met $SLO"
    if held "$s"; then best=$r; else miss=$r; break; fi
done
if [ -z "$best" ]; then
    echo "run.sh: even $(echo "$SEARCH_RATES" | cut -d' ' -f1) req/s misses the SLO; give lower SEARCH_RATES" >&2
    exit 1
fi
if [ -n "$miss" ]; then
    mid=$(python3 -c "print('%g' % (($best + $miss) / 2))")
    loadgen "$DIR/scenario_on.json" "$mid" "$SEARCH_DURATION" "$OUT/search-$mid.json"
    s=$(share "$OUT/search-$mid.json")
    echo "search: rate $mid req/s: $s of requests met $SLO"
    if held "$s"; then best=$mid; fi
fi
echo "$best" >"$OUT/sustained_rate"
echo "sustained rate: $best req/s"

for mode in on off; do
    for l in $LEVELS; do
        r=$(python3 -c "print('%g' % ($best * $l))")
        loadgen "$DIR/scenario_$mode.json" "$r" "$DURATION" "$OUT/$mode-${l}x.json"
        echo "priorities $mode, ${l}x = $r req/s: $(share "$OUT/$mode-${l}x.json") met the SLO"
    done
done
echo "reports in $OUT; picture and table: python3 $DIR/plot.py $OUT"
