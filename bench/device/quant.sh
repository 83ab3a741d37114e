#!/bin/sh
# bench/device/quant.sh — GGUF block formats on the GPU (kernels/cuda/qgemv.cu) in one call
# (under 9 minutes; steps in order of value, the last ones cut by the budget if it runs short):
#   - correctness: test_qgemv (the GEMV of 1-8 rows in Q8_0, Q4_K, Q5_K, Q6_K against a float64
#     reference, with the RMSNorm and the SiLU-gated pair fused in; fused norm, gate, RoPE and
#     K/V write against the unfused kernels; the rows into bf16), test_model (CPU against CUDA in
#     q4_k_m / q8_0 / q5_k; SEMFLOW_CUDA_QFUSE=1 against =0), test_ops (every op, block formats
#     at 5 and 12 rows; last);
#   - test_qgemv --perf: each format's GEMV at Llama-3-8B's shapes, one and four rows, with and
#     without the fusions, in % of the copy bandwidth;
#   - batch-1 decode of Llama-3-8B at 512 keys in q4_k_m, q4_k, q6_k and q8_0, SEMFLOW_CUDA_QFUSE
#     0 and 1 alternated (q4_k_m twice), one profile of a q4_k_m token with each;
#   - steps of 16 and 32 sequences (decode-batch, q4_k_m) through the dequantized chunks and
#     cuBLASLt (SEMFLOW_CUDA_QGEMV_ROWS=8, the default) against the GEMV 8 rows a launch (=32);
#   - prefill of 2048 tokens in q4_k_m (the dequantized chunks and cuBLASLt).
# Files under $OUT/quant/: runs.txt (every command, its exit code and seconds), NAME.log for
# tests, NAME.json / NAME.err for benches; a table is printed last.
#
# Usage (repo root, prebuilt build/): OUT=DIR sh bench/device/quant.sh
# Exits 77 (skipped) on a machine without an NVIDIA GPU.
set -u
BIN=${SF_BIN:-build/semflow}
BUILD_DIR=${SF_BUILD:-build}
D=${OUT:-./out}/quant
BUDGET=${QUANT_BUDGET_S:-560}
mkdir -p "$D"
. bench/device/lib_gpu.sh # need_gpu NAME
. bench/device/lib_step.sh # step NAME SECONDS [VAR=VALUE...] CMD...
need_gpu quant
if [ ! -x "$BIN" ]; then
    echo "quant: $BIN is missing: build first (make), or point SF_BIN at the binary"
    exit 1
fi
: >"$D/runs.txt"
T0=$(date +%s)

QT=$BUILD_DIR/tests/device/test_qgemv
MT=$BUILD_DIR/tests/device/test_model
OT=$BUILD_DIR/tests/device/test_ops
L8="$BIN bench decode --preset llama-3-8b --steps 32 --ctx 512 --backend cuda --load-format dummy --json"

"$BIN" hal --json >"$D/hal.json" 2>"$D/hal.err"
step qgemv 45 "$QT"
step model 100 "$MT"
for dt in q4_k_m q4_k q6_k q8_0; do
    step "$dt-0" 25 SEMFLOW_CUDA_QFUSE=0 $L8 --dtype "$dt"
    step "$dt-1" 25 SEMFLOW_CUDA_QFUSE=1 $L8 --dtype "$dt"
done
step q4_k_m-0b 25 SEMFLOW_CUDA_QFUSE=0 $L8 --dtype q4_k_m
step q4_k_m-1b 25 SEMFLOW_CUDA_QFUSE=1 $L8 --dtype q4_k_m
DB="$BIN bench decode-batch --preset llama-3-8b --steps 8 --ctx 256 --backend cuda --load-format dummy --dtype q4_k_m --json"
for bt in 16 32; do
    step "b$bt-rows8" 30 SEMFLOW_CUDA_QGEMV_ROWS=8 $DB --batch $bt
    step "b$bt-rows32" 30 SEMFLOW_CUDA_QGEMV_ROWS=32 $DB --batch $bt
done
step perf 40 "$QT" --perf
step prefill 30 $BIN bench prefill --preset llama-3-8b --ctx 2048 --steps 3 --backend cuda --load-format dummy --dtype q4_k_m --json
step prof-0 30 SEMFLOW_CUDA_PROFILE=1 SEMFLOW_CUDA_QFUSE=0 $BIN bench decode --preset llama-3-8b --steps 4 --ctx 512 --backend cuda --load-format dummy --dtype q4_k_m
step prof-1 30 SEMFLOW_CUDA_PROFILE=1 SEMFLOW_CUDA_QFUSE=1 $BIN bench decode --preset llama-3-8b --steps 4 --ctx 512 --backend cuda --load-format dummy --dtype q4_k_m
step ops 130 SEMFLOW_CUDA_QGEMV_ROWS=32 "$OT"
cat "$D/runs.txt"
[ -f "$D/perf.log" ] && cat "$D/perf.log"
for p in prof-0 prof-1; do [ -f "$D/$p.log" ] && echo "$p:" && grep -A40 'cuda profile' "$D/$p.log" | head -45; done

python3 bench/device/runs_table.py "$D" q4_k_m-0 q4_k_m-1 q4_k_m-0b q4_k_m-1b q4_k-0 q4_k-1 q6_k-0 q6_k-1 q8_0-0 q8_0-1 \
    b16-rows8 b16-rows32 b32-rows8 b32-rows32 prefill
