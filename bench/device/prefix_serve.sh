#!/bin/sh
# bench/device/prefix_serve.sh — the prefix cache as a client sees it (docs/PERFORMANCE.md
# "Prefix cache"): `semflow serve` with Llama-3-8B's shape (dummy weights, lib_model.sh), chat
# requests that share a system prompt of PREFIX words (~1.3 tokens a word with TinyLlama's
# tokenizer) and each add USER_WORDS words of their own, OUTPUT tokens out, Poisson arrivals at RATE
# requests/s (N of them), once with the prefix cache and once with --no-enable-prefix-caching.
# Prints TTFT (median, P90), TPOT and the cached share for each.
# Usage (repo root, prebuilt build/): OUT=DIR sh bench/device/prefix_serve.sh (~2 min)
# Env: PREFIX (1500), USER_WORDS (40), OUTPUT (64), RATE (8), N (120). Exit 77 without a GPU.
set -u
BIN=${SF_BIN:-build/semflow}
D=${OUT:-./out}/prefix_serve
PREFIX=${PREFIX:-1500} USER_W=${USER_WORDS:-40} OUTPUT=${OUTPUT:-64} RATE=${RATE:-8} N=${N:-120}
mkdir -p "$D"
. bench/device/lib_gpu.sh
need_gpu prefix_serve
. bench/device/lib_model.sh
model_8b "$D/model" || exit 1
port=18500
for c in on off; do
    port=$((port + 1))
    f=""; [ $c = off ] && f=--no-enable-prefix-caching
    "$BIN" serve --model "$D/model" --load-format dummy --backend cuda --port $port --workers 4 $f >"$D/serve-$c.log" 2>&1 &
    spid=$!
    i=0
    until curl -sf "http://127.0.0.1:$port/health" >/dev/null; do
        i=$((i + 1))
        if [ $i -gt 900 ] || ! kill -0 $spid 2>/dev/null; then echo "prefix_serve: server ($c) not ready"; tail -5 "$D/serve-$c.log"; kill $spid 2>/dev/null; exit 1; fi
        sleep 0.1
    done
    timeout 150 "$BIN" loadgen --url "http://127.0.0.1:$port" --chat --prefix-tokens "$PREFIX" --prompt-tokens "$USER_W" \
        --output-tokens "$OUTPUT" --rate "$RATE" --num-requests "$N" --json "$D/loadgen-$c.json" >"$D/loadgen-$c.txt" 2>&1
    kill $spid 2>/dev/null
    wait $spid 2>/dev/null
    python3 -c "import json,sys; a=json.load(open(sys.argv[1]))['all']; print('cache %s: %d of %d completed; TTFT median %.1f ms, P90 %.1f ms; TPOT median %.2f ms; %.0f output tokens/s; %d of %d prompt tokens found cached' % (sys.argv[2], a['completed'], a['issued'], a['ttft']['median_ms'], a['ttft']['p90_ms'], a['tpot']['median_ms'], a['output_throughput'], a['cached_tokens'], a['input_tokens']))" "$D/loadgen-$c.json" "$c"
done
