#!/bin/sh
# bench/device/sat.sh — the saturated decode step at TP=1 (256 sequences x ~192 keys, Llama-3-8B
# random bf16 weights) within 120 s on one GPU:
#   1. test_gemm --perf: the dispatcher's checks against a float64 host reference, the tuner's
#      disk cache, and a table of µs per call (cuBLASLt heuristic's first vs the tuner's choice) at
#      n = 128/192/256 for the 8B shapes and their TP=2 shards, weights rotated past L2, against
#      max(bytes/HBM, FLOPs/peak);
#   2. the 256x192 step op by op (SEMFLOW_CUDA_PROFILE=1: each op timed alone, graphs off);
#   3. bench decode-batch 256x192 (graphs);
#   4. bench throughput 128/128 with 512 prompts, 256 running, beside that step (--compare);
#   5. test_decode_attn and test_smallops checks with what time is left.
# Usage (repo root, prebuilt build/): OUT=DIR sh bench/device/sat.sh; files in $OUT/sat/, a table
# last. Exits 77 (skipped) without an NVIDIA GPU.
set -u
BIN=${SF_BIN:-build/semflow}
TB=${SF_BUILD:-build}/tests/device
D=${OUT:?set OUT to a folder for the results}/sat
BUDGET=${SAT_BUDGET_S:-108}
mkdir -p "$D"
if ! nvidia-smi -L >/dev/null 2>&1; then
    echo "sat: no NVIDIA GPU on this machine (nvidia-smi lists none): nothing to measure; run it on the GPU host"
    exit 77
fi
for f in "$BIN" "$TB/test_gemm" "$TB/test_decode_attn" "$TB/test_smallops"; do
    [ -x "$f" ] || { echo "sat: $f is missing: build first (make, with CUDA), or set SF_BIN / SF_BUILD"; exit 1; }
done
T0=$(date +%s)
el() { echo $(($(date +%s) - T0)); }
left() { echo $((BUDGET - $(el))); }
: >"$D/runs.txt"
echo "sat: $(nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader 2>/dev/null | head -1), commit $(cat .devcommit 2>/dev/null || git rev-parse --short HEAD 2>/dev/null)"

# r NAME SECONDS ENV CMD...: one run into NAME.out / NAME.err if SECONDS are left (else skipped);
# ENV is VAR=value words for the run, or - for none
r() {
    name=$1 lim=$2 envs=$3
    shift 3
    [ "$envs" = - ] && envs=
    l=$(left)
    if [ "$l" -lt 6 ]; then
        echo "$name: skipped (${l} s left)" | tee -a "$D/runs.txt"
        return
    fi
    [ "$lim" -gt "$l" ] && lim=$l
    t=$(date +%s)
    env $envs timeout -k 3 "$lim" "$@" >"$D/$name.out" 2>"$D/$name.err"
    echo "$name: rc=$? ${envs:+$envs }($(($(date +%s) - t)) s, at $(el) s)" | tee -a "$D/runs.txt"
}
P="--load-format dummy --preset llama-3-8b --backend cuda"
DB="bench decode-batch $P --batch 256 --ctx 192 --chunk 192 --steps 8 --json"
TP="bench throughput $P --input 128 --output 128 --num-prompts 512 --max-num-seqs 256 --json" # 256 running: the step above

r test_gemm 50 - "$TB/test_gemm" --perf
r profile 30 SEMFLOW_CUDA_PROFILE=1 "$BIN" $DB
r db 20 - "$BIN" $DB
r thr 25 - "$BIN" $TP --compare "$D/db.out"
r test_decode_attn 15 - "$TB/test_decode_attn"
r test_smallops 15 - "$TB/test_smallops"

echo "==== sat summary ($(el) s) ===="
cat "$D/runs.txt"
grep -h -E '^(FAIL|[0-9]+ passed)' "$D"/test_*.out 2>/dev/null
grep -h "gemm tuner: m=" "$D/test_gemm.err" "$D/test_gemm.out" "$D/db.err" 2>/dev/null | grep -v "k split" |
    sed 's/^.*gemm tuner: /tuner: /' | head -24
echo "GEMM per call at decode batches (us; % = bound / time):"
grep -E '^PERF' "$D/test_gemm.out" 2>/dev/null | awk '$5 == "n" || $5 <= 256' | sed 's/^PERF //'
echo "the 256x192 decode step op by op (us/call of each op alone):"
awk '/cuda profile/ { p = 1 } /op +m +k/ && p { print } p && NF == 7 && $4 == 256' "$D/profile.err" 2>/dev/null
python3 - "$D" <<'PY'
import json, os, sys
d = sys.argv[1]
def load(n):
    try:
        return json.load(open(os.path.join(d, n + ".out")))
    except (OSError, ValueError):
        return None
a, b = load("db"), load("thr")
print("%12s %9s %13s %8s" % ("step 256x192", "bound", "128/128 tok/s", "of bound"))
print("%12s %9s %13s %8s" % ("%.3f ms" % a["ms_per_step_median"] if a else "-", "%.3f ms" % a["roofline_ms"] if a else "-",
                            "%.0f" % b["output_tokens_per_s"] if b else "-", "%.1f%%" % (100 * b["bound"]["ratio"]) if b else "-"))
PY
