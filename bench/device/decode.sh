#!/bin/sh
# bench/device/decode.sh — the batch-1 decode figures of docs/PERFORMANCE.md in one go (under 60 s):
#   - correctness first: whole-model logits against the CPU backend (build/tests/device/test_model)
#     with the fused kernels on and off and with every fused GEMV on the cp.async ring, and the
#     batch-1 GEMVs against a host reference (build/tests/device/test_gemv) with each kernel
#     choice of SEMFLOW_CUDA_GEMV_RING (docs/CUDA.md "Fused batch-1 decode");
#   - the layer's four fused GEMVs (Llama-3-8B shapes) alone and chained in a graph, with their
#     block-shape variants (test_gemv --perf), per kernel choice;
#   - batch-1 decode of the Llama-3-8B and Qwen2-7B shapes (random bf16 weights) at 512 and 4096
#     tokens of context as the backend runs by default (every fused GEMV on the cp.async ring);
#     Llama-3-8B at 512 with SEMFLOW_CUDA_GEMV_RING=0 (the register kernels, one row per warp for
#     O and down: the earlier default) and 1 (the ring, one row per warp for O and down);
#   - the same decode with the fused kernels off (SEMFLOW_CUDA_FUSED=0), as the budget allows
#     (each decode run costs ~4-5 s, most of it model set-up).
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

# correctness first
MT=$BUILD_DIR/tests/device/test_model
GT=$BUILD_DIR/tests/device/test_gemv
if [ -x "$MT" ] && [ -x "$GT" ]; then
    step model-fused1 20 SEMFLOW_CUDA_FUSED=1 "$MT"
    step model-fused0 20 SEMFLOW_CUDA_FUSED=0 "$MT"
    step gemv 15 "$GT"
    step gemv-ring1 15 SEMFLOW_CUDA_GEMV_RING=1 "$GT"
    step model-ring0 20 SEMFLOW_CUDA_GEMV_RING=0 "$MT"
    # the four GEMVs without attention, each alone and chained, and their variants (~1 s each)
    step layer 6 "$GT" --perf
    step layer-ring0 6 SEMFLOW_CUDA_GEMV_RING=0 "$GT" --perf
else
    echo "test_model/test_gemv: missing under $BUILD_DIR/tests/device (device tests are built with CUDA)" >>"$D/runs.txt"
fi

# each decode run costs ~4-5 s (model set-up): the record, the kernel choices beside it, then
# the unfused sequence as the budget allows (earlier calls: docs/PERFORMANCE.md)
B="$BIN bench"
P="--backend cuda --load-format dummy --json"
L8="$B decode --preset llama-3-8b --steps 32 $P"
Q7="$B decode --preset qwen2-7b --steps 32 $P"
step llama3-ctx512 12 $L8 --ctx 512
step llama3-ctx4096 12 $L8 --ctx 4096
step qwen2-ctx512 12 $Q7 --ctx 512
step qwen2-ctx4096 12 $Q7 --ctx 4096
step l8-512-ring0 12 SEMFLOW_CUDA_GEMV_RING=0 $L8 --ctx 512
step l8-512-ring1 12 SEMFLOW_CUDA_GEMV_RING=1 $L8 --ctx 512
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
names = ["llama3-ctx512", "llama3-ctx4096", "qwen2-ctx512", "qwen2-ctx4096", "l8-512-ring0", "l8-512-ring1",
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
