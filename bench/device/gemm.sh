#!/bin/sh
# bench/device/gemm.sh — the GEMM figures of docs/PERFORMANCE.md (within 45 s): the dispatcher at
# the Llama-3-8B shapes against a float64 host reference with the measured algorithm choice on
# (build/tests/device/test_gemm --perf: correctness, the disk cache, and a table of µs per call
# with cuBLASLt's heuristic choice and the tuner's, against max(bytes / HBM, FLOPs / peak) from
# hal), then the saturated decode steps it is for (decode-batch, Llama-3-8B random bf16 weights:
# 256 sequences at 192 keys, 128 at 1500) with the tuner on and off (SEMFLOW_CUDA_GEMM_TUNE=0).
# test_gemm tunes into this GPU's cache, so the "on" runs also show a restart not tuning again.
# Runs that no longer fit in the time left are skipped and say so. Files in $OUT/gemm/; a table
# is printed last.
#
# Usage (repo root, prebuilt build/): OUT=DIR sh bench/device/gemm.sh
# Exits 77 (skipped) on a machine without an NVIDIA GPU.
set -u
BIN=${SF_BIN:-build/semflow}
TEST=${SF_BUILD:-build}/tests/device/test_gemm
D=${OUT:-./out}/gemm
LIMIT=${GEMM_LIMIT_S:-43}
mkdir -p "$D"
if ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gemm: no NVIDIA GPU on this machine (nvidia-smi found none): nothing to measure; run it on the GPU host"
    exit 77
fi
if [ ! -x "$BIN" ] || [ ! -x "$TEST" ]; then
    echo "gemm: $BIN or $TEST is missing: build first (make, with CUDA), or set SF_BIN / SF_BUILD"
    exit 1
fi
T0=$(date +%s)
left() { echo $((LIMIT - ($(date +%s) - T0))); }
echo "gemm: $(nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader 2>/dev/null | head -1), commit $(cat .devcommit 2>/dev/null || git rev-parse --short HEAD 2>/dev/null)"
: >"$D/runs.txt"

timeout -k 3 20 "$TEST" --perf >"$D/test_gemm.log" 2>&1
echo "test_gemm --perf: rc=$? $(tail -1 "$D/test_gemm.log") ($(($(date +%s) - T0)) s)" >>"$D/runs.txt"
grep '^FAIL' "$D/test_gemm.log" >>"$D/runs.txt"

# run NAME NEED_SECONDS TUNE ARGS...: one decode-batch bench, if NEED_SECONDS are left
run() {
    name=$1 need=$2 tune=$3
    shift 3
    l=$(left)
    if [ "$l" -lt "$need" ]; then
        echo "$name: skipped ($l s left, needs about $need)" >>"$D/runs.txt"
        return
    fi
    t=$(date +%s)
    SEMFLOW_CUDA_GEMM_TUNE=$tune timeout -k 2 "$l" "$BIN" bench decode-batch --load-format dummy --preset llama-3-8b \
        --backend cuda --steps 8 --json "$@" >"$D/$name.json" 2>"$D/$name.err"
    echo "$name: rc=$? tune=$tune $* ($(($(date +%s) - t)) s)" >>"$D/runs.txt"
}
run b256-tuned 9 1 --batch 256 --ctx 192 --chunk 192
run b128-tuned 12 1 --batch 128 --ctx 1500 --chunk 1500
run b256-heuristic 8 0 --batch 256 --ctx 192 --chunk 192
run b128-heuristic 11 0 --batch 128 --ctx 1500 --chunk 1500

# what is left: tune every bucket of the Llama-3-8B shapes into this GPU's cache (a deployment's
# once-per-GPU step), so later runs on this GPU do not pay it in their first steps
l=$(left)
if [ "$l" -ge 4 ]; then
    timeout -k 1 "$((l - 1))" "$TEST" --pretune >"$D/pretune.log" 2>&1
    echo "test_gemm --pretune: rc=$? $(grep '^pretune:' "$D/pretune.log") $(tail -1 "$D/pretune.log")" >>"$D/runs.txt"
fi

echo "---- runs"
cat "$D/runs.txt"
echo "---- tuner decisions (test_gemm)"
grep -E '^  [a-z_+]+ +m=' "$D/test_gemm.log" | head -40
echo "---- GEMM per call (test_gemm --perf)"
grep -E '^(PERF|GEMM per call|tuning time)' "$D/test_gemm.log"
echo "---- decode-batch steps (ms per step, median; bound = weights + KV at hal's HBM rate)"
printf '%-16s %8s %8s %7s\n' run ms bound ratio
for f in b256-tuned b256-heuristic b128-tuned b128-heuristic; do
    j="$D/$f.json"
    if [ -s "$j" ] && command -v python3 >/dev/null 2>&1; then
        python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print("%-16s %8.2f %8.2f %7.3f" % (sys.argv[2], d["ms_per_step_median"], d["roofline_ms"], d["ratio"]))' "$j" "$f" 2>/dev/null ||
            echo "$f: unreadable JSON ($(tail -1 "$D/$f.err"))"
    else
        echo "$f: no result ($(tail -1 "$D/$f.err" 2>/dev/null))"
    fi
done
echo "gemm: $(($(date +%s) - T0)) s"
