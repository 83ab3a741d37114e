#!/bin/sh
# bench/device/prefill.sh — prefill attention on the GPU, in about 30 s: the kernel test
# (build/tests/device/test_prefill_attn: FlashAttention-2-style and WMMA kernels against a float64
# reference over many shapes, then --perf: causal 512/2048/4096 tokens, us and TFLOP/s), whole-model
# logits against the CPU backend with the default kernel (test_model), `semflow bench prefill` at 2048
# tokens for the Llama-3-8B and Qwen2-7B shapes with each kernel (SEMFLOW_ATTN_PREFILL=fa2, the default, / wmma;
# SEMFLOW_ATTN_FA2_BK=32 for 32-key tiles),
# and compute-sanitizer memcheck on the quick kernel test when time is left. Each step is bounded
# by `timeout` and skipped when the remaining budget (PREFILL_BUDGET_S, default 32 s) is too short.
# Files: $OUT/prefill/*.log, *.json, *.err; a summary table is printed last.
#
# Usage (repo root, prebuilt build/): OUT=DIR sh bench/device/prefill.sh
# Exits 77 (skipped) on a machine without an NVIDIA GPU.
set -u
BIN=${SF_BIN:-build/semflow}
TB=${SF_BUILD:-build}/tests/device
D=${OUT:-./out}/prefill
BUDGET=${PREFILL_BUDGET_S:-32}
T0=$(date +%s)
mkdir -p "$D"
if ! nvidia-smi -L >/dev/null 2>&1; then
    echo "prefill: no NVIDIA GPU on this machine (nvidia-smi found none): nothing to measure; run it on the GPU host"
    exit 77
fi
for f in "$BIN" "$TB/test_prefill_attn"; do
    if [ ! -x "$f" ]; then
        echo "prefill: $f is missing: build first (make, with nvcc present), or set SF_BIN / SF_BUILD"
        exit 1
    fi
done
echo "prefill: $(nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader 2>/dev/null | head -1), commit $(cat .devcommit 2>/dev/null || git rev-parse --short HEAD 2>/dev/null)"
: >"$D/runs.txt"

left() { echo $((BUDGET - ($(date +%s) - T0))); }
# step NAME SECONDS CMD...: run CMD bounded by SECONDS (less if the budget is shorter), output to
# $D/NAME.log; skipped when fewer than 3 s remain.
step() {
    name=$1 lim=$2
    shift 2
    l=$(left)
    if [ "$l" -lt 3 ]; then echo "$name: skipped (budget spent)" >>"$D/runs.txt"; return; fi
    [ "$lim" -gt "$l" ] && lim=$l
    t=$(date +%s)
    timeout -k 2 "$lim" "$@" >"$D/$name.log" 2>&1
    rc=$?
    echo "$name: rc=$rc $(($(date +%s) - t)) s: $(grep -E '^[0-9]+ passed' "$D/$name.log" | tail -1)" >>"$D/runs.txt"
    grep '^FAIL' "$D/$name.log" | head -5 >>"$D/runs.txt"
}
# bench NAME SECONDS KERNEL PRESET [VAR=VALUE]: one prefill bench with --json
bench() {
    name=$1 lim=$2 kern=$3 preset=$4 extra=${5:-SEMFLOW_ATTN_FA2_BK=64}
    l=$(left)
    if [ "$l" -lt 4 ]; then echo "$name: skipped (budget spent)" >>"$D/runs.txt"; return; fi
    [ "$lim" -gt "$l" ] && lim=$l
    env "$extra" SEMFLOW_ATTN_PREFILL="$kern" timeout -k 2 "$lim" "$BIN" bench prefill --load-format dummy --preset "$preset" \
        --backend cuda --ctx 2048 --steps 5 --json >"$D/$name.json" 2>"$D/$name.err"
    echo "$name: rc=$? $extra SEMFLOW_ATTN_PREFILL=$kern $BIN bench prefill --load-format dummy --preset $preset --backend cuda --ctx 2048 --steps 5 --json" >>"$D/runs.txt"
}

step kernels 13 "$TB/test_prefill_attn" --perf
bench llama3-fa2 7 fa2 llama-3-8b
bench llama3-wmma 7 wmma llama-3-8b
if [ -x "$TB/test_model" ]; then
    step model-fa2 12 "$TB/test_model"
else
    echo "model-fa2: $TB/test_model missing" >>"$D/runs.txt"
fi
bench llama3-fa2-k32 7 fa2 llama-3-8b SEMFLOW_ATTN_FA2_BK=32
bench qwen2-fa2 7 fa2 qwen2-7b
if command -v compute-sanitizer >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/compute-sanitizer ]; then
    CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
    step memcheck 10 "$CS" --tool memcheck --error-exitcode 9 "$TB/test_prefill_attn" --quick
else
    echo "memcheck: compute-sanitizer not found" >>"$D/runs.txt"
fi
bench qwen2-wmma 7 wmma qwen2-7b
cat "$D/runs.txt"
grep '^perf:' "$D/kernels.log" 2>/dev/null
grep -E '^  (2048 tokens|chunk p0 1600)|^FAIL|\]: token' "$D/kernels.log" 2>/dev/null | head -30

python3 - "$D" <<'PY'
import json, os, sys
d = sys.argv[1]
print("%-15s %10s %10s %9s %8s" % ("run", "ms", "tokens/s", "TFLOP/s", "MFU"))
for name in ["llama3-fa2", "llama3-fa2-k32", "llama3-wmma", "qwen2-fa2", "qwen2-wmma"]:
    try:
        j = json.load(open(os.path.join(d, name + ".json")))
        print("%-15s %10.1f %10.0f %9.0f %7.1f%%" % (name, j.get("ms_median", 0), j.get("tokens_per_s", 0),
              j.get("tflops", 0), 100 * j.get("mfu", 0)))
    except Exception as e:
        try:
            err = open(os.path.join(d, name + ".err")).read().strip().splitlines()
        except OSError:
            err = []
        print("%-15s failed or skipped: %s" % (name, err[-1] if err else e))
PY
echo "prefill: $(($(date +%s) - T0)) s"
