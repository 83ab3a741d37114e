#!/bin/sh
# bench/device/decattn.sh — decode attention of many sequences, on a GPU host, within 40 s:
#   1. build/tests/device/test_decode_attn: --perf times the decode-attention kernels (the
#      CUDA-core "lanes" kernel, the tensor-core "mma" kernel in each configuration, the
#      persistent "stream" kernel) on 256x192, 512x192, 128x1500, 64x4096, 16x1024, 4x4096, 1x512,
#      1x4096, 1x4120 (bf16 and INT8; a cache under 4x L2 read from rotating copies of it)
#      as a share of hal's measured HBM bandwidth; then (another process)
#      the checks against a float64 reference over batches 1..256, ragged contexts 1..8192, GQA
#      32/8, 28/4, 64/8 and head 64, bf16 / INT8 / mixed blocks, with and without key splits,
#      the stream kernel also on 1 and 7 blocks and replayed;
#   2. build/tests/device/test_smallops (rmsnorm, silu_mul, rope_kv, add, embed against the CPU
#      reference; the first three launched as programmatic dependents), and test_ops --mixed:
#      steps mixing prefill chunks and decodes, the decodes through the stream kernel over their
#      rows (SEMFLOW_CUDA_MIXED_DECODE=1), against the host reference;
#   3. `semflow bench decode-batch` on llama-3-8b (dummy weights) at 128 sequences x 1500 keys
#      (graphs on) with the dispatcher's choice (stream from 1024 keys, the per-item mma
#      kernel below) and with the mma kernel (=mma, the old figure), then as time allows 256 x 192.
# Runs from the repo root with a prebuilt build/; writes under $OUT/decattn/; without a GPU it
# says so and exits 77. The summary table is printed last.
set -u
OUT=${OUT:?set OUT to a folder for the results}/decattn
BIN=${SF_BIN:-build/semflow}
mkdir -p "$OUT"
if ! nvidia-smi -L >/dev/null 2>&1; then echo "decattn: no GPU here (nvidia-smi lists none): skipped"; exit 77; fi
[ -x "$BIN" ] || { echo "decattn: $BIN missing: build first (make)"; exit 1; }
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }

echo "decattn: $(nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader 2>/dev/null | head -1), commit $(cat .devcommit 2>/dev/null || git rev-parse --short HEAD 2>/dev/null)"

# 1. kernel timings, then correctness (separate processes: a fault in one leaves the other)
timeout -k 1 7 build/tests/device/test_decode_attn --perf >"$OUT/test_decode_attn_perf.log" 2>&1
echo "decattn: test_decode_attn --perf rc=$? at $(el) s"
timeout -k 1 10 build/tests/device/test_decode_attn >"$OUT/test_decode_attn.log" 2>&1
echo "decattn: test_decode_attn rc=$? at $(el) s"
# 2. the small ops' checks; steps mixing prefill chunks and decodes with the decodes through the
#    stream kernel (SEMFLOW_CUDA_MIXED_DECODE=1) against the host reference
timeout -k 1 10 build/tests/device/test_smallops >"$OUT/test_smallops.log" 2>&1
echo "decattn: test_smallops rc=$? at $(el) s"
SEMFLOW_CUDA_MIXED_DECODE=1 timeout -k 1 6 build/tests/device/test_ops --mixed >"$OUT/test_ops_mixed.log" 2>&1
echo "decattn: test_ops --mixed rc=$? at $(el) s"

# 3. whole decode steps at the batch shapes (each run ~6-9 s: weights, batch-1 pass, 8 steps)
run_db() { # NAME BATCH CTX SECONDS [ENV=VALUE]
    env ${5:-SF_NOTHING=1} timeout -k 1 "$4" "$BIN" bench decode-batch --load-format dummy --preset llama-3-8b \
        --backend cuda --batch "$2" --ctx "$3" --chunk "$3" --steps 8 --json >"$OUT/$1.json" 2>"$OUT/$1.err"
    echo "decattn: $1 rc=$? at $(el) s"
}
left() { [ $(( 38 - $(el) )) -ge "$1" ]; } # enough of the 40 s left for a run of $1 s
left 11 && run_db b128-1500 128 1500 11
left 11 && run_db b128-1500-mma 128 1500 11 SEMFLOW_CUDA_DECODE_ATTN=mma
left 8 && run_db b256-192 256 192 8

echo "==== decattn summary ($(el) s) ===="
grep -E '^(FAIL|PASS)|passed' "$OUT/test_decode_attn.log" "$OUT/test_smallops.log" "$OUT/test_ops_mixed.log"
grep -E '^perf:' "$OUT/test_decode_attn_perf.log" | sed 's/ | /\n    /g'
python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
print("%-24s %10s %10s %7s %10s %10s" % ("decode-batch llama-3-8b", "ms/step", "bound ms", "share", "tok/s", "host us"))
for name in ("b128-1500", "b128-1500-mma", "b256-192"):
    try:
        d = json.load(open(os.path.join(out, name + ".json")))
    except (OSError, ValueError):
        print("%-24s did not finish (see %s.err)" % (name, name))
        continue
    print("%-24s %10.2f %10.2f %6.0f%% %10.0f %10.0f" % (name, d["ms_per_step_median"], d["roofline_ms"],
          100 * d["ratio"], d["tokens_per_s"], d.get("host_us_per_step", 0)))
PY
