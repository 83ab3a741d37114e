#!/bin/sh
# bench/device/decode.sh — the batch-1 decode figures of docs/PERFORMANCE.md in one go (under 70 s):
#   - correctness first: the persistent batch-1 layer (decode_persist.cu) against a host reference
#     and the fused kernel sequence (build/tests/device/test_decode_persist), then whole-model
#     logits against the CPU backend (build/tests/device/test_model) with it on
#     (SEMFLOW_CUDA_PERSIST=1) and with the default path;
#   - batch-1 decode of the Llama-3-8B and Qwen2-7B shapes (random bf16 weights) at 512 and 4096
#     tokens of context, the persistent kernel on (SEMFLOW_CUDA_PERSIST=1: a step's layers in one
#     launch; 2: a launch per layer) and off (docs/CUDA.md "Fused batch-1 decode"),
#     as the budget allows (each decode run costs ~4-5 s, most of it model set-up).
# Each run's JSON goes to $OUT/decode/<name>.json, its stderr to <name>.err; runs.txt has every
# command with its exit code and seconds; a table is printed last.
#
# Usage (repo root, prebuilt build/): OUT=DIR sh bench/device/decode.sh
# Exits 77 (skipped) on a machine without an NVIDIA GPU.
set -u
BIN=${SF_BIN:-build/semflow}
BUILD_DIR=${SF_BUILD:-build}
D=${OUT:-./out}/decode
BUDGET=${DECODE_BUDGET_S:-63} # seconds this script may spend (its hard limit is 70)
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

# correctness first (a persistent kernel that hangs is cut by the step's limit)
MT=$BUILD_DIR/tests/device/test_model
PT=$BUILD_DIR/tests/device/test_decode_persist
if [ -x "$MT" ] && [ -x "$PT" ]; then
    step persist-layer 15 "$PT"
else
    echo "test_model/test_decode_persist: missing under $BUILD_DIR/tests/device (device tests are built with CUDA)" >>"$D/runs.txt"
fi

# each decode run costs ~4-5 s (model set-up): persistent layer on, then off, per shape
B="$BIN bench"
P="--backend cuda --load-format dummy --json"
L8="$B decode --preset llama-3-8b --steps 32 $P"
Q7="$B decode --preset qwen2-7b --steps 32 $P"
step l8-512-persist 10 SEMFLOW_CUDA_PERSIST=1 $L8 --ctx 512
step l8-512 10 $L8 --ctx 512
step l8-512-perlayer 10 SEMFLOW_CUDA_PERSIST=2 $L8 --ctx 512
step l8-512-persist-st4 10 SEMFLOW_CUDA_PERSIST=1 SEMFLOW_CUDA_PERSIST_ST=4 $L8 --ctx 512
[ -x "$MT" ] && step model-persist 15 SEMFLOW_CUDA_PERSIST=1 "$MT"
step q7-512-persist 10 SEMFLOW_CUDA_PERSIST=1 $Q7 --ctx 512
step q7-512 10 $Q7 --ctx 512
step l8-4096-persist 10 SEMFLOW_CUDA_PERSIST=1 $L8 --ctx 4096
step l8-4096 10 $L8 --ctx 4096
step q7-4096-persist 10 SEMFLOW_CUDA_PERSIST=1 $Q7 --ctx 4096
step q7-4096 10 $Q7 --ctx 4096
cat "$D/runs.txt"
[ -f "$D/persist-layer.log" ] && grep '^  ' "$D/persist-layer.log"

# the table: one line per run from its JSON (python3 is on the GPU host)
python3 - "$D" <<'PY'
import json, os, sys
d = sys.argv[1]
names = ["l8-512-persist", "l8-512", "l8-512-perlayer", "l8-512-persist-st4", "q7-512-persist", "q7-512", "l8-4096-persist", "l8-4096", "q7-4096-persist",
         "q7-4096"]
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
