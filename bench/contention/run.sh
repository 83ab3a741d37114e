#!/bin/sh
# The contention experiment (issue 5): semflow serves a high class (realtime-chat) beside a low
# class (batch-summarize, long prompts) on a KV pool too small for both, so low-class sequences
# are preempted by swap and come back over PCIe, while a neighbour process (h2d_hog) saturates
# the same GPU's link host-to-device. The same load runs with the DMA tuner off, then on; the
# high class's TTFT and ITL P99 are compared.
#
#   sh bench/contention/run.sh [OUTDIR]          (default OUTDIR: build/contention)
#
# Env: MODEL (TinyLlama 1.1B's config and tokenizer from the test data, dummy weights),
#      SERVE_ARGS (extra serve flags), KV_BLOCKS (160), HIGH_RESERVE (0: no KV kept for the high
#      class, so every high-class admission into a full pool preempts a low-class sequence), SEQS (16), RATE (req/s, 10), DURATION (s of
#      load per run, 20), REQ_TIMEOUT (s a request may take, 5: bounds the tail of a run), HOG (1: run the neighbour; 0: none), TUNERS ("off on"),
#      SEED (1), SCENARIO (bench/contention/scenario.json), LOADFMT (dummy; auto for a real model). Needs root for the monitor (its contention
#      index drives the tuner) and a GPU for the neighbour: without one it says so and exits 77,
#      unless HOG=0 (a rehearsal of the swap traffic alone, e.g. MODEL=demo LOADFMT=auto on a CPU).
# Writes OUTDIR/<tuner>.json (loadgen), <tuner>.metrics (the server's /metrics after the run),
# <tuner>.serve.log, <tuner>.hog.log, and prints a table last.
set -u
cd "$(dirname "$0")/../.."
OUT=${1:-build/contention}
BIN=${SEMFLOW_BIN:-build/semflow}
HOGBIN=${HOGBIN:-build/bench/h2d_hog}
MODEL=${MODEL:-${SF_TESTDATA:-../shared/testdata}/tinyllama-1.1b-chat-v1.0}
if [ ! -f "$MODEL/config.json" ] && [ "$MODEL" != demo ] && [ "${MODEL#preset:}" = "$MODEL" ] && [ ! -f "$MODEL" ]; then
    echo "contention: $MODEL not found (SF_TESTDATA?): using the demo model instead"
    MODEL=demo LOADFMT=auto
fi
LOADFMT=${LOADFMT:-dummy}
KV_BLOCKS=${KV_BLOCKS:-160}
HIGH_RESERVE=${HIGH_RESERVE:-0}
SEQS=${SEQS:-16}
RATE=${RATE:-10}
REQ_TIMEOUT=${REQ_TIMEOUT:-5}
DURATION=${DURATION:-20}
HOG=${HOG:-1}
TUNERS=${TUNERS:-off on}
SEED=${SEED:-1}
SCENARIO=${SCENARIO:-bench/contention/scenario.json}
SERVE_ARGS=${SERVE_ARGS:-}
[ -x "$BIN" ] || { echo "contention: $BIN not found; build first (make)"; exit 1; }
if [ "$HOG" = 1 ] && ! nvidia-smi -L >/dev/null 2>&1; then
    echo "contention: no GPU here (nvidia-smi lists none) for the neighbour: skipped (HOG=0 runs without one)"; exit 77
fi
if [ "$HOG" = 1 ] && [ ! -x "$HOGBIN" ]; then echo "contention: $HOGBIN not built (make with CUDA)"; exit 1; fi
mkdir -p "$OUT"

get() { python3 -c 'import sys, urllib.request as u; sys.stdout.write(u.urlopen(sys.argv[1], timeout=5).read().decode())' "$1"; }
spid=""; hpid=""
stop_all() {
    [ -n "$hpid" ] && kill "$hpid" 2>/dev/null && wait "$hpid" 2>/dev/null
    if [ -n "$spid" ]; then
        kill "$spid" 2>/dev/null
        i=0; while kill -0 "$spid" 2>/dev/null && [ $i -lt 150 ]; do sleep 0.1; i=$((i + 1)); done
        kill -9 "$spid" 2>/dev/null; wait "$spid" 2>/dev/null
    fi
    spid=""; hpid=""
}
trap stop_all EXIT
trap 'exit 1' HUP INT TERM

for t in $TUNERS; do
    PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    URL=http://127.0.0.1:$PORT
    # shellcheck disable=SC2086
    "$BIN" serve --model "$MODEL" --load-format "$LOADFMT" --port "$PORT" --workers 2 --num-kv-blocks "$KV_BLOCKS" \
        --kv-high-reserve "$HIGH_RESERVE" \
        --max-num-seqs "$SEQS" --swap-space 2 --drain-timeout 1 --dma-tuner "$t" $SERVE_ARGS \
        >"$OUT/$t.serve.log" 2>&1 &
    spid=$!
    i=0
    until get "$URL/health" >/dev/null 2>&1; do
        i=$((i + 1))
        if [ $i -gt 1200 ] || ! kill -0 "$spid" 2>/dev/null; then
            echo "contention: the server (tuner $t) did not become healthy; its log:"; tail -20 "$OUT/$t.serve.log"; exit 1
        fi
        sleep 0.1
    done
    if [ "$HOG" = 1 ]; then
        "$HOGBIN" $((DURATION + 8)) 8 0 >"$OUT/$t.hog.log" 2>&1 &
        hpid=$!
        sleep 2 # the monitor sees the neighbour's rate after an interval or two
    fi
    n=$(python3 -c "import math; print(int(math.ceil($RATE * $DURATION * 2)) + 10)")
    "$BIN" loadgen --url "$URL" --scenario "$SCENARIO" --rate "$RATE" --duration "$DURATION" \
        --num-requests "$n" --seed "$SEED" --timeout "$REQ_TIMEOUT" --json "$OUT/$t.json" >"$OUT/$t.loadgen.txt" 2>&1
    get "$URL/metrics" >"$OUT/$t.metrics" 2>/dev/null
    stop_all
done

python3 bench/contention/summary.py "$OUT" $TUNERS
