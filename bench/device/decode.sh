#!/bin/sh
# bench/device/decode.sh — the batch-1 decode figures of docs/PERFORMANCE.md in one go (under 60 s):
#   - correctness first: whole-model logits against the CPU backend (build/tests/device/test_model)
#     with the fused kernels on and off and with every L2 option on, and the batch-1 GEMVs
#     against a host reference (build/tests/device/test_gemv) as launched by default and with
#     the L2 options on;
#   - the layer's four fused GEMVs (Llama-3-8B shapes) alone and chained in a graph, with their
#     block-shape variants (test_gemv --perf), as launched by default and with L2 options;
#   - batch-1 decode of the Llama-3-8B and Qwen2-7B shapes (random bf16 weights) at 512 and 4096
#     tokens of context as the backend runs by default, and Llama-3-8B with the L2 options of the
#     fused path (docs/CUDA.md "Fused batch-1 decode"): SEMFLOW_CUDA_L2HINT=1 (weight loads
#     evict_first), SEMFLOW_CUDA_L2PF=MB (each GEMV's first wave prefetches its rows into L2
#     before its wait), SEMFLOW_CUDA_L2PF_DEEP=1 (every block does), SEMFLOW_CUDA_L2NEXT=MB (the
#     O projection pulls the gate/up weight's first MB into L2 while attention runs),
#     SEMFLOW_CUDA_L2AHEAD=N (rows bulk-prefetched N loop iterations ahead of the loads), and
#     SEMFLOW_CUDA_GEMV_RING=1 (every fused GEMV's weight loads through a cp.async ring in shared
#     memory: gemv_ring.cu for O and down, the ring mode of gemv_fused.cu for the others);
#   - the same decode with the fused kernels off (SEMFLOW_CUDA_FUSED=0), as the budget allows
#     (each decode run costs ~5 s, most of it model set-up).
# Each run's JSON goes to $OUT/decode/<name>.json, its stderr to <name>.err; runs.txt has every
# command with its exit code and seconds; a table is printed last.
#
# Usage (repo root, prebuilt build/): OUT=DIR sh bench/device/decode.sh
# Exits 77 (skipped) on a machine without an NVIDIA GPU.
set -u
BIN=${SF_BIN:-build/semflow}
BUILD_DIR=${SF_BUILD:-build}
D=${OUT:-./out}/decode
BUDGET=${DECODE_BUDGET_S:-54} # seconds this script may spend (its hard limit is 60)
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

# step NAME SECONDS [VAR=VALUE...] CMD...: one bounded command, output to NAME.log (tests) or
# NAME.json / NAME.err (benches: the command ends in --json); skipped when the budget is spent
step() {
    name=$1 lim=$2
    shift 2
    left=$((BUDGET - ($(date +%s) - T0)))
    if [ "$left" -lt 4 ]; then
        echo "$name: skipped (the script's $BUDGET s are spent)" >>"$D/runs.txt"
        return
    fi
    [ "$lim" -gt "$left" ] && lim=$left
    t=$(date +%s)
    case "$*" in
    *--json*) timeout -k 3 "$lim" env "$@" >"$D/$name.json" 2>"$D/$name.err" ;;
    *) timeout -k 3 "$lim" env "$@" >"$D/$name.log" 2>&1 ;;
    esac
    rc=$?
    echo "$name: rc=$rc $(($(date +%s) - t)) s: $*" >>"$D/runs.txt"
    case "$*" in *--json*) ;; *) tail -1 "$D/$name.log" | sed "s/^/    /" >>"$D/runs.txt"
                                grep '^FAIL' "$D/$name.log" >>"$D/runs.txt" ;; esac
}
ALL="SEMFLOW_CUDA_L2HINT=1 SEMFLOW_CUDA_L2PF=24 SEMFLOW_CUDA_L2NEXT=16 SEMFLOW_CUDA_L2AHEAD=1"

# correctness first
MT=$BUILD_DIR/tests/device/test_model
GT=$BUILD_DIR/tests/device/test_gemv
if [ -x "$MT" ] && [ -x "$GT" ]; then
    step model-fused1 20 SEMFLOW_CUDA_FUSED=1 "$MT"
    step model-fused0 20 SEMFLOW_CUDA_FUSED=0 "$MT"
    step model-l2all 20 $ALL "$MT"
    step gemv-l2all 15 $ALL "$GT"
    step gemv-ring 15 SEMFLOW_CUDA_GEMV_RING=1 "$GT"
    step model-ring 20 SEMFLOW_CUDA_GEMV_RING=1 "$MT"
else
    echo "test_model/test_gemv: missing under $BUILD_DIR/tests/device (device tests are built with CUDA)" >>"$D/runs.txt"
fi

B="$BIN bench"
P="--backend cuda --load-format dummy --json"
L8="$B decode --preset llama-3-8b --steps 32 $P"
Q7="$B decode --preset qwen2-7b --steps 32 $P"
step llama3-ctx512 12 $L8 --ctx 512
step l8-512-ring 12 SEMFLOW_CUDA_GEMV_RING=1 $L8 --ctx 512
if [ -x "$GT" ]; then # the four GEMVs without attention, each alone and chained (~2 s each)
    step layer-base 6 "$GT" --perf
    step layer-ring 6 SEMFLOW_CUDA_GEMV_RING=1 "$GT" --perf
    step layer-ahead2 6 SEMFLOW_CUDA_L2HINT=1 SEMFLOW_CUDA_L2AHEAD=2 "$GT" --perf
    # why a GEMV is below the bytes: ncu on the chain's first QKV, O, gate/up and down (each
    # replayed alone by ncu, so without the PDL overlap)
    NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null)
    [ -n "$NCU" ] && step ncu-layer 14 "$NCU" --clock-control none -k regex:k_gemv_fused --launch-count 4 \
        --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats "$GT" --perf
fi
# each decode run costs ~5 s (model init): the options not yet measured, then the rest of the
# record as the budget allows (earlier calls: docs/PERFORMANCE.md)
step l8-512-ahead1 12 SEMFLOW_CUDA_L2AHEAD=1 $L8 --ctx 512
step l8-512-ahead2 12 SEMFLOW_CUDA_L2HINT=1 SEMFLOW_CUDA_L2AHEAD=2 $L8 --ctx 512
step llama3-ctx4096 12 $L8 --ctx 4096
step l8-4096-next32 12 SEMFLOW_CUDA_L2HINT=1 SEMFLOW_CUDA_L2NEXT=32 $L8 --ctx 4096
step qwen2-ctx512 12 $Q7 --ctx 512
step qwen2-ctx4096 12 $Q7 --ctx 4096
step llama3-ctx512-unfused 12 SEMFLOW_CUDA_FUSED=0 $L8 --ctx 512
step qwen2-ctx512-unfused 12 SEMFLOW_CUDA_FUSED=0 $Q7 --ctx 512
step llama3-ctx4096-unfused 12 SEMFLOW_CUDA_FUSED=0 $L8 --ctx 4096
step qwen2-ctx4096-unfused 12 SEMFLOW_CUDA_FUSED=0 $Q7 --ctx 4096
cat "$D/runs.txt"
for f in "$D"/layer-*.log; do [ -f "$f" ] && echo "$(basename "$f" .log):" && grep '^perf:' "$f"; done

# the table: one line per run from its JSON (python3 is on the GPU host)
python3 - "$D" <<'PY'
import json, os, sys
d = sys.argv[1]
names = ["llama3-ctx512", "l8-512-ring", "l8-512-ahead1", "l8-512-ahead2", "llama3-ctx4096", "l8-4096-next32",
         "qwen2-ctx512", "qwen2-ctx4096",
         "llama3-ctx512-unfused", "qwen2-ctx512-unfused", "llama3-ctx4096-unfused", "qwen2-ctx4096-unfused"]
print("%-24s %10s %10s %10s %8s %9s" % ("run", "ms", "tokens/s", "roofline", "ratio", "host"))
for name in names:
    try:
        j = json.load(open(os.path.join(d, name + ".json")))
    except Exception as e:
        try:
            err = open(os.path.join(d, name + ".err")).read().strip().splitlines()
        except OSError:
            err = ["not run"]
        print("%-24s failed: %s" % (name, err[-1] if err else e))
        continue
    print("%-24s %10.3f %10.1f %8.3fms %7.1f%% %7.1fus" % (name, j["ms_per_token_median"], j["tokens_per_s"],
          j.get("roofline_ms", 0), 100 * j["ratio"], j.get("host_us_per_step", 0)))
PY
