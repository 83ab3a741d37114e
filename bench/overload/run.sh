#!/bin/sh
# Mixed-priority overload ladder (issue 6): a realtime-chat class (tenant A, urgency=high,
# max-latency=400ms, short prompts) and a batch-summarize class (tenant B, urgency=low,
# min-throughput=50tokens/sec, long prompts), Poisson arrivals, against one `semflow serve`.
#
#   sh bench/overload/run.sh [OUTDIR]        (default OUTDIR: build/overload)
#
# Scenario files: bench/overload/$SET/{on,off}-{1,2,4,8}x.json (SET=cpu: the demo model on the
# CPU; SET=h200: the Llama-3-8B shape on an H200). Each holds its classes, its rate, duration and
# SLO; "off" sends both classes as urgency=normal without max-latency, so the waiting queue is in
# arrival order (FCFS) — same tenants, keys and lengths. Priorities on and off are one server:
# the scenario decides, so no restart is needed.
# 1. 1x: with SEARCH_RATES set, Poisson rates ascending with priorities on; a rate holds when at
#    least GOOD_SHARE of the requests issued met the SLO (loadgen's goodput); the search stops at
#    the first miss and tries the midpoint once; 1x is the highest rate that held. With
#    SEARCH_RATES empty, 1x is RATE_1X, else the rate in $SET/on-1x.json.
# 2. Ladder: for each level of LEVELS, priorities on then off (interleaved, so drifting background
#    load hits both alike), at level x 1x for DURATION s. While each runs, watch.py samples
#    /metrics (KV usage peak, degraded state, scheduler decisions, preemptions).
# 3. OUTDIR/<on|off>-<level>x.json (loadgen), .metrics.json (watch.py), .txt (loadgen's table);
#    OUTDIR/sustained_rate; OUTDIR/serve.log; OUTDIR/trace.tsv (one line per engine step); then the
#    table (plot.py --no-png) is printed. DEADLINE (s since start, 0: none) skips levels that
#    would not finish in time, so a bounded caller still gets a table.
#
# Env: SET (cpu), MODEL (demo), BACKEND (auto), SERVE_ARGS (extra `semflow serve` flags),
#      QUEUE_LIMIT (per-lane queue before 429, 16), SLO (the scenario's), GOOD_SHARE (0.9),
#      SEARCH_RATES ("1 2 4 8 16" for cpu, "" for h200), RATE_1X, SEARCH_DURATION (12), DURATION (the
#      scenario's), LEVELS ("1 2 4 8"), LONG_LEVELS (levels run for LONG_DURATION s instead, so that
#      KV pressure can outlast the degrade hold; "" none), MODES ("on off": which of each level run),
#      SEED (1), DEADLINE (0), READY_TIMEOUT (s, 300),
#      WARMUP_S (0: none; else a run of that long before anything is measured, of WARMUP_SCEN at
#      WARMUP_RATE req/s: by default the scenario's 1x file and rate; a warm-up at the top level
#      reaches the batch sizes the ladder will, whose first steps time GEMM paths and capture graphs),
#      SETTLE_S (0: none; else before each ladder run, wait up to that long for the degraded state to end).
set -e
cd "$(dirname "$0")/../.."
T0=$(date +%s)
OUT=${1:-build/overload}
SET=${SET:-cpu}
MODEL=${MODEL:-demo}
BACKEND=${BACKEND:-auto}
QUEUE_LIMIT=${QUEUE_LIMIT:-16}
GOOD_SHARE=${GOOD_SHARE:-0.9}
if [ "$SET" = cpu ]; then SEARCH_RATES=${SEARCH_RATES-1 2 4 8 16}; else SEARCH_RATES=${SEARCH_RATES-}; fi
SEARCH_DURATION=${SEARCH_DURATION:-12}
LEVELS=${LEVELS:-1 2 4 8}
LONG_LEVELS=${LONG_LEVELS:-}
SEED=${SEED:-1}
DEADLINE=${DEADLINE:-0}
READY_TIMEOUT=${READY_TIMEOUT:-300}
BIN=${SEMFLOW_BIN:-build/semflow}
DIR=bench/overload
SCEN=$DIR/$SET
[ -x "$BIN" ] || { echo "run.sh: $BIN not found; build first: make" >&2; exit 1; }
[ -f "$SCEN/on-1x.json" ] || { echo "run.sh: no scenarios in $SCEN; SET is cpu or h200" >&2; exit 1; }
mkdir -p "$OUT"
field() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"; }
SLO=${SLO:-$(field "$SCEN/on-1x.json" slo)}
DURATION=${DURATION:-$(field "$SCEN/on-1x.json" duration_s)}
LONG_DURATION=${LONG_DURATION:-$DURATION}
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
URL=http://127.0.0.1:$PORT
# shellcheck disable=SC2086  # SERVE_ARGS is a list of flags
"$BIN" serve --model "$MODEL" --backend "$BACKEND" --port "$PORT" --tenants "$DIR/tenants.json" \
    --queue-limit "$QUEUE_LIMIT" --bpf off --sched-trace "$OUT/trace.tsv" $SERVE_ARGS 2>"$OUT/serve.log" &
spid=$!
wpid=""
cleanup() {
    [ -n "$wpid" ] && kill "$wpid" 2>/dev/null
    kill $spid 2>/dev/null
    wait $spid 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 1' HUP INT TERM PIPE  # through the EXIT trap: the server is not left behind
i=0
until curl -sf "$URL/health" >/dev/null; do
    i=$((i + 1))
    if [ $i -gt $((READY_TIMEOUT * 10)) ] || ! kill -0 $spid 2>/dev/null; then
        echo "run.sh: the server did not become healthy; its log:" >&2; tail -20 "$OUT/serve.log" >&2; exit 1
    fi
    sleep 0.1
done
echo "server ready after $(( $(date +%s) - T0 )) s"

# settle: wait (at most SETTLE_S s) until the scheduler is out of the degraded state, so that each
# run starts from the normal state and the decisions counted during it are its own.
settle() {
    python3 - "$URL" "${SETTLE_S:-0}" <<'PY' || true
import sys, time, urllib.request
url, limit = sys.argv[1], float(sys.argv[2])
t0 = time.time()
while time.time() - t0 < limit:
    try:
        text = urllib.request.urlopen(url + "/metrics", timeout=2).read().decode()
    except OSError:
        break
    if "\nsemflow_sched_degraded 1" not in text:
        break
    time.sleep(0.25)
PY
}
# loadgen SCENARIO RATE DURATION NAME: one open-loop run bounded by time, watched.
loadgen() {
    n=$(python3 -c "import math; print(int(math.ceil($2 * $3 * 2)) + 10)")
    python3 $DIR/watch.py "$URL" "$OUT/$4.metrics.json" &
    wpid=$!
    sleep 0.3
    "$BIN" loadgen --url "$URL" --scenario "$1" --rate "$2" --duration "$3" --num-requests "$n" \
        --slo "$SLO" --seed "$SEED" --timeout 120 --json "$OUT/$4.json" >"$OUT/$4.txt" || true
    kill "$wpid" 2>/dev/null; wait "$wpid" 2>/dev/null || true
    wpid=""
}
# share NAME: the share of issued requests that met the SLO.
share() {
    python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); a=r["all"]
print("%.3f" % (a["goodput"] * r["duration_s"] / a["issued"] if a["issued"] else 0))' "$OUT/$1.json" 2>/dev/null || echo 0
}
held() { python3 -c "import sys; sys.exit(0 if $1 >= $GOOD_SHARE else 1)"; }
left() { [ "$DEADLINE" -le 0 ] && echo 1000000 || echo $((DEADLINE - ($(date +%s) - T0))); }

if [ "${WARMUP_S:-0}" -gt 0 ]; then  # first steps of new shapes (GEMM tuning, graph captures) stay out of the figures
    WARMUP_SCEN=${WARMUP_SCEN:-$SCEN/on-1x.json}
    WARMUP_RATE=${WARMUP_RATE:-$(field "$WARMUP_SCEN" rate)}
    loadgen "$WARMUP_SCEN" "$WARMUP_RATE" "$WARMUP_S" warmup
    echo "warm-up: $WARMUP_S s of $(basename "$WARMUP_SCEN") at $WARMUP_RATE req/s"
fi
best=""
miss=""
for r in $SEARCH_RATES; do
    loadgen "$SCEN/on-1x.json" "$r" "$SEARCH_DURATION" "search-$r"
    s=$(share "search-$r")
    echo "search: rate $r req/s: $s of requests met $SLO"
    if held "$s"; then best=$r; else miss=$r; break; fi
done
if [ -n "$SEARCH_RATES" ] && [ -z "$best" ]; then
    best=$(echo "$SEARCH_RATES" | cut -d' ' -f1)
    echo "run.sh: even $best req/s misses the SLO; the ladder starts there anyway (give lower SEARCH_RATES)" >&2
fi
if [ -n "$miss" ] && [ -n "$best" ] && [ "$best" != "$miss" ]; then
    mid=$(python3 -c "print('%g' % (($best + $miss) / 2))")
    loadgen "$SCEN/on-1x.json" "$mid" "$SEARCH_DURATION" "search-$mid"
    s=$(share "search-$mid")
    echo "search: rate $mid req/s: $s of requests met $SLO"
    if held "$s"; then best=$mid; fi
fi
[ -n "$best" ] || best=${RATE_1X:-$(field "$SCEN/on-1x.json" rate)}
echo "$best" >"$OUT/sustained_rate"
echo "1x = $best req/s"

for l in $LEVELS; do
    for mode in ${MODES:-on off}; do
        if [ "$(left)" -lt $((DURATION + 20)) ]; then
            echo "run.sh: $(left) s left before the deadline: $mode-${l}x skipped"
            continue
        fi
        r=$(python3 -c "print('%g' % ($best * $l))")
        d=$DURATION
        case " $LONG_LEVELS " in *" $l "*) d=$LONG_DURATION ;; esac
        if [ "$(left)" -lt $((d + 20)) ]; then d=$DURATION; fi
        settle
        loadgen "$SCEN/$mode-${l}x.json" "$r" "$d" "$mode-${l}x"
        echo "priorities $mode, ${l}x = $r req/s: $(share "$mode-${l}x") met the SLO ($(( $(date +%s) - T0 )) s)"
    done
done
python3 $DIR/plot.py "$OUT" --no-png || true
