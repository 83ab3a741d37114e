#!/bin/sh
# bench/device/sat.sh — the saturated decode step at TP=1 (256 sequences x ~192 keys, Llama-3-8B
# random bf16 weights) within 180 s on one GPU, with the own wgmma GEMM (gemm_wgmma.cu) on and off
# (SEMFLOW_CUDA_GEMM_OWN=1/0) in the same call:
#   1. test_gemm --perf with the own kernel a tuner candidate: the own kernel called directly at
#      every cluster-rank count against a float64 host reference, the dispatcher's checks, and a
#      table of µs per call (cuBLASLt heuristic, tuner, own kernel) at n = 128/192/256 for the 8B
#      shapes and their TP=2 shards, weights rotated past L2, against max(bytes/HBM, FLOPs/peak);
#   2. the 256x192 step op by op (SEMFLOW_CUDA_PROFILE=1: each op timed alone, graphs off);
#   3. bench decode-batch 256x192 (graphs) own on / own on with the gate/up GEMM's SiLU·mul
#      epilogue (SEMFLOW_CUDA_GEMM_GLU=1) / off;
#   4. bench throughput 128/128 with 512 prompts, the same three;
#   5. test_decode_attn and test_smallops checks with what time is left.
# The "on" runs go first: the tuner writes its winners (cuBLASLt's best and the own kernel's) to
# this GPU's cache, and the "off" runs read the same entries and take cuBLASLt's best.
# Usage (repo root, prebuilt build/): OUT=DIR sh bench/device/sat.sh; files in $OUT/sat/, a table
# last. Exits 77 (skipped) without an NVIDIA GPU.
set -u
BIN=${SF_BIN:-build/semflow}
TB=${SF_BUILD:-build}/tests/device
D=${OUT:?set OUT to a folder for the results}/sat
BUDGET=${SAT_BUDGET_S:-172}
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

# r NAME SECONDS ENV CMD...: one run into NAME.out / NAME.err if SECONDS are left (else skipped)
r() {
    name=$1 lim=$2 envs=$3
    shift 3
    l=$(left)
    if [ "$l" -lt 6 ]; then
        echo "$name: skipped (${l} s left)" | tee -a "$D/runs.txt"
        return
    fi
    [ "$lim" -gt "$l" ] && lim=$l
    t=$(date +%s)
    env $envs timeout -k 3 "$lim" "$@" >"$D/$name.out" 2>"$D/$name.err"
    echo "$name: rc=$? $envs ($(($(date +%s) - t)) s, at $(el) s)" | tee -a "$D/runs.txt"
}
P="--load-format dummy --preset llama-3-8b --backend cuda"
DB="bench decode-batch $P --batch 256 --ctx 192 --chunk 192 --steps 8 --json"
TP="bench throughput $P --input 128 --output 128 --num-prompts 512 --json"

# the own kernel's variants against the float64 reference first: every variant (OWN=1) in the
# tuner only when all of them pass, else the ones without multicast (OWN=2)
r test_own 25 SF_RUN=1 "$TB/test_gemm" --own
OWN=2
grep -q '^0 failed\|^[0-9]* passed, 0 failed' "$D/test_own.out" 2>/dev/null && OWN=1
echo "sat: the tuner's own-kernel candidates: SEMFLOW_CUDA_GEMM_OWN=$OWN" | tee -a "$D/runs.txt"
r test_gemm 55 SEMFLOW_CUDA_GEMM_OWN=$OWN "$TB/test_gemm" --perf
r profile 30 "SEMFLOW_CUDA_GEMM_OWN=$OWN SEMFLOW_CUDA_PROFILE=1" "$BIN" $DB
r db-own 20 SEMFLOW_CUDA_GEMM_OWN=$OWN "$BIN" $DB
r db-glu 20 "SEMFLOW_CUDA_GEMM_OWN=$OWN SEMFLOW_CUDA_GEMM_GLU=1" "$BIN" $DB
r db-lt 20 SEMFLOW_CUDA_GEMM_OWN=0 "$BIN" $DB
r thr-own 25 SEMFLOW_CUDA_GEMM_OWN=$OWN "$BIN" $TP --compare "$D/db-own.out"
r thr-glu 25 "SEMFLOW_CUDA_GEMM_OWN=$OWN SEMFLOW_CUDA_GEMM_GLU=1" "$BIN" $TP --compare "$D/db-glu.out"
r thr-lt 25 SEMFLOW_CUDA_GEMM_OWN=0 "$BIN" $TP --compare "$D/db-lt.out"
r test_decode_attn 15 SF_RUN=1 "$TB/test_decode_attn"
r test_smallops 15 SF_RUN=1 "$TB/test_smallops"

echo "==== sat summary ($(el) s) ===="
cat "$D/runs.txt"
grep -h -E '^(FAIL|[0-9]+ passed)' "$D"/test_*.out 2>/dev/null
grep -h "gemm tuner: .*own kernel" "$D/test_gemm.err" "$D/test_gemm.out" "$D/db-own.err" 2>/dev/null | sed 's/^.*gemm tuner: /tuner: /' | head -24
echo "GEMM per call at decode batches (us; var = the own kernel's fastest variant; % = bound / time):"
grep -E '^PERF' "$D/test_gemm.out" 2>/dev/null | awk '$5 == "n" || $5 <= 256' | sed 's/^PERF //'
echo "the own kernel per variant (1-4: ranks along k; 5-8: the same with x multicast to tile pairs), us:"
grep -E '^OWN' "$D/test_gemm.out" 2>/dev/null | sed 's/^OWN //'
echo "the 256x192 decode step op by op (own kernel on; us/call of each op alone):"
awk '/cuda profile/ { p = 1 } /op +m +k/ && p { print } p && NF == 7 && $4 == 256' "$D/profile.err" 2>/dev/null
python3 - "$D" <<'PY'
import json, os, sys
d = sys.argv[1]
def load(n):
    try:
        return json.load(open(os.path.join(d, n + ".out")))
    except (OSError, ValueError):
        return None
print("%-8s %12s %12s %8s" % ("own", "step 256x192", "128/128 tok/s", "of bound"))
for tag, db, tp in (("on", "db-own", "thr-own"), ("on+glu", "db-glu", "thr-glu"), ("off", "db-lt", "thr-lt")):
    a, b = load(db), load(tp)
    step = "%.3f ms" % a["ms_per_step_median"] if a else "-"
    tok = "%.0f" % b["output_tokens_per_s"] if b else "-"
    share = "%.1f%%" % (100 * b["bound"]["ratio"]) if b else "-"
    print("%-8s %12s %12s %8s" % (tag, step, tok, share))
b = load("db-lt")
for tag, n in (("own", "db-own"), ("own+glu", "db-glu")):
    a = load(n)
    if a and b:
        print("step %s/off: %.3fx (bound %.3f ms)" % (tag, a["ms_per_step_median"] / b["ms_per_step_median"], a["roofline_ms"]))
PY
