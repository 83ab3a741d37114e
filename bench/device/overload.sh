#!/bin/sh
# bench/device/overload.sh — the mixed-priority overload ladder on one H200 (issue 6), <= 300 s.
#
# Usage (repo root of a prebuilt tree, on the GPU host): OUT=DIR sh bench/device/overload.sh
# Serves a Llama-3-8B-shaped model with dummy bf16 weights (config.json written here, a Llama
# tokenizer from $SF_TESTDATA/tinyllama-1.1b-chat-v1.0, else the demo model's; the vocabulary is
# the tokenizer's, see below), checks 1x = 48 req/s with a 5 s run (priorities on, SLO TTFT
# 300 ms and 50 tokens/s; SEARCH_RATES below) after a 4 s warm-up at 384
# req/s (8x of the 48 req/s found before: the first steps at each decode batch size up to the
# seat limit time GEMM candidates and capture graphs, which made the first second of call 3's
# 8x run steps of 96-184 ms), then runs 1x, 8x, 4x, 2x with
# priorities on and off (bench/overload/h200/*.json) through bench/overload/run.sh, which watches
# /metrics (KV usage and demand, degrade decisions) during each run; 4x and 8x run 16 s so that
# KV pressure can outlast the default 5 s degrade hold, and 1x too (the base of the realtime
# TTFT rise: ~570 realtime requests instead of ~290 for its P95); before each run the server is given up to
# 7 s to leave a degraded state the run before left (so decisions are counted in the run that made
# them). The KV pool is held to 1024 blocks (16k tokens, 2 GiB) and the seats to 256, so that at
# 8x the KV pool, not the seats, is what the high class's headroom leaves short and the degrade
# path can be seen. Then
# the INT8 KV quality cost (`semflow bench kv-quality`, Llama-3-8B dummy preset) and the step
# trace summarised per run (bench/overload/trace_summary.py), and, as time allows, 1x and 8x with
# priorities again on a second server with CMP_ENV in its environment (below).
# Files: $OUT/overload/ (loadgen JSON, watch JSON, the step trace, serve.log, overload.md,
# kv-quality.json); the last thing printed is one line per run. Exit 77: no GPU or no binary here.
# Env: SEARCH_RATES ("48": 1x held fixed at what the search over 12 / 24 / 48 / 72 / 96 req/s found
# on this device in call 3 of 2026-11-30, so that ladders of different commits share one base; the
# 5 s run at 48 says whether it still holds; give "12 24 48 96" to search again), WARMUP_RATE (384), CMP_ENV (the comparison run, below; "" none), DURATION (8 s per run), LONG_DURATION (16 s at 1x, 4x and 8x: 1x is the base of the rise),
# LEVELS ("1 8 4 2"), BUDGET_S (215 for the ladder; the whole script stays under 300 s).
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:?set OUT to a folder for the results}
D=$OUT/overload
BIN=${SF_BIN:-build/semflow}
mkdir -p "$D"
if ! nvidia-smi -L >/dev/null 2>&1 || [ "$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')" -eq 0 ]; then
    echo "overload: no NVIDIA GPU visible (nvidia-smi -L lists none); this script runs on the GPU host. Skipped."
    exit 77
fi
if [ ! -x "$BIN" ]; then
    echo "overload: $BIN is missing: build the tree first (make) and carry build/. Skipped."
    exit 77
fi
echo "overload: $(nvidia-smi -L | head -1) (CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-unset}), commit $(cat .devcommit 2>/dev/null || git rev-parse --short HEAD 2>/dev/null)"

M=$D/model
. bench/device/lib_model.sh
model_8b "$M" || exit 1

T0=$(date +%s)
# The swap path's batched KV block copy: correct on this device, and its time against per-block copies.
if [ -x build/tests/device/test_swap_copy ]; then
    timeout -k 2 30 build/tests/device/test_swap_copy >"$D/swap_copy.log" 2>&1
    echo "overload: test_swap_copy rc=$? ($(grep -c '^PASS' "$D/swap_copy.log") passed, $(grep -c '^FAIL' "$D/swap_copy.log") failed)"
else
    echo "overload: build/tests/device/test_swap_copy missing (a CUDA build makes it); the copy check is skipped"
fi
SET=h200 MODEL=$M BACKEND=${BACKEND:-cuda} QUEUE_LIMIT=64 \
SERVE_ARGS="--load-format dummy --workers 4 --max-num-seqs 256 --num-kv-blocks 1024 --kv-high-reserve 0.05" \
SEARCH_RATES=${SEARCH_RATES-48} SEARCH_DURATION=5 DURATION=${DURATION:-8} LEVELS=${LEVELS:-1 8 4 2} \
LONG_LEVELS="1 4 8" LONG_DURATION=${LONG_DURATION:-16} \
DEADLINE=${BUDGET_S:-215} READY_TIMEOUT=90 WARMUP_S=4 WARMUP_SCEN=bench/overload/h200/on-8x.json \
WARMUP_RATE=${WARMUP_RATE:-384} SETTLE_S=7 \
    timeout -k 5 "${BUDGET_S:-215}" sh bench/overload/run.sh "$D" >"$D/run.log" 2>&1
rc=$?
tail -n 40 "$D/run.log"
grep -E "error|warn" "$D/serve.log" | tail -5
# The quality cost of the degrade path's INT8 KV: teacher-forced logits, bf16 KV vs INT8 KV.
left=$((285 - ($(date +%s) - T0)))
if [ "$left" -ge 20 ]; then
    timeout -k 2 $((left - 5)) "$BIN" bench kv-quality --load-format dummy --preset llama-3-8b --backend cuda --gen 16 \
        --json >"$D/kv-quality.json" 2>"$D/kv-quality.err" || echo "overload: kv-quality failed or timed out (see kv-quality.err)"
else
    echo "overload: kv-quality skipped: $left s left"
fi
# A comparison on a second server: priorities on, 1x and 8x at the 1x above, after its own
# warm-up, with CMP_ENV set (default SEMFLOW_ENGINE_OVERLAP=0: the engine's serial step order,
# token delivery before the next step's launch; SEMFLOW_SCHED_RT_ALONE=0 compares the earlier
# realtime-step rule); in $D/cmp/.
CMP_ENV=${CMP_ENV-SEMFLOW_ENGINE_OVERLAP=0}
left=$((285 - ($(date +%s) - T0)))
if [ -n "$CMP_ENV" ] && [ "$left" -ge 55 ] && [ -s "$D/sustained_rate" ]; then
    # shellcheck disable=SC2086  # CMP_ENV is a list of NAME=VALUE words
    env $CMP_ENV SET=h200 MODEL=$M BACKEND=${BACKEND:-cuda} QUEUE_LIMIT=64 \
    SERVE_ARGS="--load-format dummy --workers 4 --max-num-seqs 256 --num-kv-blocks 1024 --kv-high-reserve 0.05" \
    SEARCH_RATES="" RATE_1X="$(cat "$D/sustained_rate")" DURATION=${DURATION:-8} LEVELS="1 8" MODES=on \
    LONG_LEVELS="8" LONG_DURATION=${LONG_DURATION:-16} DEADLINE=$((left - 8)) READY_TIMEOUT=60 WARMUP_S=3 \
    WARMUP_SCEN=bench/overload/h200/on-8x.json WARMUP_RATE=${WARMUP_RATE:-384} SETTLE_S=5 \
        timeout -k 5 $((left - 5)) sh bench/overload/run.sh "$D/cmp" >"$D/cmp.log" 2>&1
    echo "overload: comparison run ($CMP_ENV) rc=$?"
else
    echo "overload: comparison run (${CMP_ENV:-none}) skipped: $left s left"
fi
echo "---- step trace per run (rt = steps carrying realtime tokens; alone = realtime prompt, batch prefill held out) ----"
python3 bench/overload/trace_summary.py "$D" 2>&1
if [ -s "$D/cmp/trace.tsv" ]; then
    echo "---- the same with $CMP_ENV ----"
    python3 bench/overload/trace_summary.py "$D/cmp" 2>&1 | grep -E "^(run|on-)"
    python3 bench/overload/plot.py "$D/cmp" --no-png --short 2>&1 | grep -E "^(prio|on|realtime)"
fi
python3 - "$D/kv-quality.json" <<'PY' 2>/dev/null || true
import json, sys
j = json.load(open(sys.argv[1]))
print("INT8 KV vs bf16 KV (%s, %d positions): max|dlogit| %.4g, mean|dlogit| %.4g, rel L2 %.3g, top-1 %.1f%%, greedy %d/%d"
      % (j["model"], j["positions"], j["max_abs_dlogit"], j["mean_abs_dlogit"], j["rel_l2"],
         100 * j["top1_agreement"], j["greedy_same"], j["greedy_total"]))
PY
echo "---- overload summary (rc=$rc; rt = realtime-chat, bt = batch-summarize; c/429 = completed/rejected) ----"
python3 bench/overload/plot.py "$D" --no-png --short 2>&1 | grep -v '^wrote'
exit $rc
