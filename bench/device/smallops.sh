#!/bin/sh
# bench/device/smallops.sh — the bandwidth-bound kernels (rmsnorm + residual add, silu_mul, add,
# embed, rope_kv + paged K/V write) on a GPU host, within 25 s:
#   1. build/tests/device/test_smallops --perf: every op against the CPU reference over n = 1 ..
#      2048 and the model shapes, then µs / GB/s / share of hal's HBM figure at Llama-3-8B shapes;
#   2. `semflow bench prefill` llama-3-8b (dummy weights), 2048 tokens, 5 steps: the step they sit in;
#   3. if time is left, the same prefill with SEMFLOW_CUDA_PROFILE=1 (each op timed alone with
#      events: the per-op table of the forward pass).
# Runs from the repo root with a prebuilt build/; writes under $OUT/smallops/; without a GPU it
# says so and exits 77. The summary table is printed last.
set -u
D=${OUT:?set OUT to a folder for the results}/smallops
BIN=${SF_BIN:-build/semflow}
TEST=${SF_BUILD:-build}/tests/device/test_smallops
mkdir -p "$D"
if ! nvidia-smi -L >/dev/null 2>&1; then echo "smallops: no GPU here (nvidia-smi lists none): skipped"; exit 77; fi
[ -x "$BIN" ] || { echo "smallops: $BIN missing: build first (make)"; exit 1; }
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
echo "smallops: $(nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader 2>/dev/null | head -1), commit $(cat .devcommit 2>/dev/null || git rev-parse --short HEAD 2>/dev/null)"

# 1. correctness + per-op bandwidth
if [ -x "$TEST" ]; then
    timeout -k 2 13 "$TEST" --perf >"$D/test_smallops.log" 2>&1
    echo "smallops: test_smallops rc=$? at $(el) s: $(tail -n 1 "$D/test_smallops.log")"
    grep -E '^(FAIL|  |      )' "$D/test_smallops.log" | head -n 20
else
    echo "smallops: $TEST missing (device tests are built with CUDA)" | tee "$D/test_smallops.log"
fi

# 2. the prefill step
P="--load-format dummy --preset llama-3-8b --backend cuda --ctx 2048"
timeout -k 2 7 "$BIN" bench prefill $P --steps 5 --json >"$D/prefill.json" 2>"$D/prefill.err"
echo "smallops: prefill rc=$? at $(el) s"

# 3. per-op table of the prefill step, when the budget allows
if [ "$(el)" -le 17 ]; then
    SEMFLOW_CUDA_PROFILE=1 timeout -k 1 $(( 23 - $(el) )) "$BIN" bench prefill $P --steps 2 --json \
        >"$D/prefill-profile.json" 2>"$D/prefill-profile.err"
    echo "smallops: prefill profile rc=$? at $(el) s"
    grep -E '^  (op|embed|rmsnorm|rope_kv|silu_mul|add|gemm|attention)' "$D/prefill-profile.err"
fi

# the tuning variants (sf_k_rmsnorm_tune: vpt/prefetch_w/rows_per_block, "-x" without the add;
# sf_k_rope_kv_tune: threads/target blocks), then the summary: the dispatchers' figures
echo "---- variants ----"
grep -E '^perf: +r[nk]' "$D/test_smallops.log"
echo "---- smallops summary ($(el) s) ----"
grep -E '^(perf:|[0-9]+ passed)' "$D/test_smallops.log" | grep -vE '^perf: +r[nk]'
python3 - "$D/prefill.json" <<'PY'
import json, sys
try:
    j = json.load(open(sys.argv[1]))
    print("prefill llama-3-8b 2048 tokens: %.2f ms/step, %.0f tokens/s, %.1f TFLOP/s, MFU %.1f%% (GEMM peak %.0f)"
          % (j["ms_median"], j["tokens_per_s"], j["tflops"], 100 * j["mfu"], j.get("gemm_peak_tflops", 0)))
except Exception as e:
    print("prefill: no result (%s); see prefill.err" % e)
PY
