#!/bin/sh
# bench/device/decode.sh — the batch-1 decode figures of docs/PERFORMANCE.md in one go (under 90 s):
#   - correctness: the batch-1 GEMVs against a host reference (build/tests/device/test_gemv)
#     and whole-model logits against the CPU backend (build/tests/device/test_model), with the
#     default path (test_decode_attn: attention against its float64 reference too);
#   - batch-1 decode (bench decode, random bf16 weights) of Llama-3-8B at 512 and 4096 keys and
#     Qwen2-7B at 512; against the default in the same call: per-op GEMV plans
#     (SEMFLOW_CUDA_GEMV_PLAN);
#   - the timeline of a step's batch-1 kernels as the graph runs (SEMFLOW_CUDA_TRACE, read by
#     bench/device/b1trace.py): per kernel of a layer, when its blocks start, pass the
#     programmatic wait and end, relative to the end of the kernel before;
#   - test_gemv --perf: a layer's four GEMVs chained in a graph at the shapes of Llama-3-8B, its
#     TP=2 shard, Llama-3-70B's TP=2 shard and Qwen2-7B, each op alone with every kernel variant,
#     in % of the copy bandwidth (default, per-op plans).
# Each bench decode costs ~4-5 s (model set-up), so the list is short and ordered by value; a
# step that would pass the budget is skipped and says so.
# Each run's JSON goes to $OUT/decode/<name>.json, its stderr to <name>.err; tests to <name>.log;
# runs.txt has every command with its exit code and seconds; a table is printed last.
#
# Usage (repo root, prebuilt build/): OUT=DIR sh bench/device/decode.sh
# Exits 77 (skipped) on a machine without an NVIDIA GPU.
set -u
BIN=${SF_BIN:-build/semflow}
BUILD_DIR=${SF_BUILD:-build}
D=${OUT:-./out}/decode
BUDGET=${DECODE_BUDGET_S:-85} # seconds this script may spend (its hard limit is 90)
mkdir -p "$D"
if ! nvidia-smi -L >/dev/null 2>&1; then
    echo "decode: no NVIDIA GPU on this machine (nvidia-smi found none): nothing to measure; run it on the GPU host"
    exit 77
fi
if [ ! -x "$BIN" ]; then
    echo "decode: $BIN is missing: build first (make), or point SF_BIN at the binary"
    exit 1
fi
echo "decode: $(nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader 2>/dev/null | head -1), commit $(cat .devcommit 2>/dev/null || git rev-parse --short HEAD 2>/dev/null)"
: >"$D/runs.txt"
T0=$(date +%s)

. bench/device/lib_step.sh # step NAME SECONDS [VAR=VALUE...] CMD...

GT=$BUILD_DIR/tests/device/test_gemv
MT=$BUILD_DIR/tests/device/test_model
B="$BIN bench"
P="--backend cuda --load-format dummy --json"
L8="$B decode --preset llama-3-8b --steps 32 $P"
Q7="$B decode --preset qwen2-7b --steps 32 $P"
AT=$BUILD_DIR/tests/device/test_decode_attn

# correctness first (a kernel that hangs is cut by the step's limit)
if [ -x "$GT" ] && [ -x "$MT" ]; then
    step gemv 12 "$GT"
    step model 10 "$MT"
else
    echo "test_gemv/test_model: missing under $BUILD_DIR/tests/device (device tests are built with CUDA)" >>"$D/runs.txt"
fi
if [ -x "$AT" ]; then
    step attn 10 "$AT"
fi
step l8-512 10 $L8 --ctx 512
# the timeline of the batch-1 kernels as the graph runs (kernels/cuda/b1trace.cuh)
step l8-512-trace 12 SEMFLOW_CUDA_TRACE="$D/trace-l8-512.txt" $L8 --ctx 512
[ -x "$GT" ] && step perf 14 "$GT" --perf
step q7-512 10 $Q7 --ctx 512
step l8-4096 10 $L8 --ctx 4096
# per-op plans (blocks per SM x 10 + ring stages) that leave an SM room for attention's
# blocks beside QKV's, and for two O blocks beside an attention block; the TP=2 shard shapes' per-op bests of session 5 in the chain
step l8-512-q33 10 SEMFLOW_CUDA_GEMV_PLAN=qkv=33 $L8 --ctx 512
step l8-512-o25 10 SEMFLOW_CUDA_GEMV_PLAN=o=25 $L8 --ctx 512
[ -x "$GT" ] && step perf-tp2plan 14 SEMFLOW_CUDA_GEMV_PLAN=qkv=26,o=33,down=25 "$GT" --perf
cat "$D/runs.txt"
for f in perf perf-tp2plan; do [ -f "$D/$f.log" ] && echo "$f:" && grep 'chain\|copy bandwidth' "$D/$f.log"; done
echo "profilers here: ncu $(command -v ncu || echo none), nsys $(command -v nsys || echo none)"
for t in l8-512; do
    if [ -f "$D/trace-$t.txt" ]; then
        echo "timeline $t:"
        python3 bench/device/b1trace.py "$D/trace-$t.txt" | tee "$D/trace-$t.sum"
        gzip -f "$D/trace-$t.txt"
    fi
done

# the table: one line per run from its JSON (python3 is on the GPU host)
python3 bench/device/runs_table.py "$D" l8-512 l8-512-trace l8-512-q33 l8-512-o25 q7-512 l8-4096
