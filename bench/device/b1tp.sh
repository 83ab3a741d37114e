#!/bin/sh
# bench/device/b1tp.sh — Llama-3-8B batch-1 decode at TP=2 against TP=1 in one call (under 60 s,
# both GPUs; run after tp.sh): the default path, then the switches under test at TP=2 (rank 1's
# plain O and down through the register GEMV as before session 9, per-op GEMV plans at the shard
# shapes, the attention split), and the timeline of both ranks' batch-1 kernels (SEMFLOW_CUDA_TRACE,
# bench/device/b1trace.py).
# Each run's JSON goes to $OUT/b1tp/<name>.json, its stderr to <name>.err; runs.txt has every
# command with its exit code and seconds; the table (ms/token, ratio to the roofline, TP=2/TP=1)
# is printed last.
#
# Usage (repo root, prebuilt build/): OUT=DIR sh bench/device/b1tp.sh
# Exits 77 (skipped) on a machine without an NVIDIA GPU; 0 with a note when fewer than 2 are visible.
set -u
BIN=${SF_BIN:-build/semflow}
D=${OUT:-./out}/b1tp
BUDGET=${B1TP_BUDGET_S:-55} # seconds this script may spend (its hard limit is 60)
mkdir -p "$D"
export NCCL_NVLS_ENABLE=0
export SEMFLOW_TP_TIMEOUT_MS=${SEMFLOW_TP_TIMEOUT_MS:-20000}
if ! nvidia-smi -L >/dev/null 2>&1; then
    echo "b1tp: no NVIDIA GPU on this machine (nvidia-smi found none): nothing to measure; run it on the GPU host"
    exit 77
fi
if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
    n=$(echo "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c .)
else
    n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
fi
if [ "${n:-0}" -lt 2 ]; then
    echo "b1tp: needs 2 GPUs (${n:-0} visible): nothing run"
    exit 0
fi
if [ ! -x "$BIN" ]; then
    echo "b1tp: $BIN is missing: build first (make), or point SF_BIN at the binary"
    exit 1
fi
echo "b1tp: $n GPUs, commit $(cat .devcommit 2>/dev/null || git rev-parse --short HEAD 2>/dev/null)"
: >"$D/runs.txt"
T0=$(date +%s)

. bench/device/lib_step.sh # step NAME SECONDS [VAR=VALUE...] CMD...

L8="$BIN bench decode --preset llama-3-8b --backend cuda --load-format dummy --steps 32 --ctx 512 --json"
OLD=SEMFLOW_CUDA_GEMV_PLAIN=0 # rank 1's O and down through the register GEMV (the default before session 9)
step tp1 10 $L8 --tensor-parallel-size 1
step tp2 14 $L8 --tensor-parallel-size 2
step tp2-oldplain 14 $OLD $L8 --tensor-parallel-size 2
step tp2-trace 15 SEMFLOW_CUDA_TRACE="$D/trace-tp2.txt" $L8 --tensor-parallel-size 2
step tp2-plan 14 SEMFLOW_CUDA_GEMV_PLAN=qkv=26,o=33 $L8 --tensor-parallel-size 2
step tp2-sp16 14 SEMFLOW_CUDA_DECODE_SPLIT=16 $L8 --tensor-parallel-size 2
cat "$D/runs.txt"
for f in trace-tp2.txt trace-tp2.txt.gpu1; do
    if [ -f "$D/$f" ]; then
        echo "timeline TP=2 ($f; rank 1 is gpu1):"
        python3 bench/device/b1trace.py "$D/$f" | tee "$D/$f.sum"
        gzip -f "$D/$f"
    fi
done

python3 - "$D" <<'PY'
import json, os, sys
d = sys.argv[1]
def load(name):
    try:
        return json.load(open(os.path.join(d, name + ".json")))
    except Exception:
        return None
base = load("tp1")
print("%-10s %10s %10s %8s %10s %8s" % ("run", "ms", "roofline", "ratio", "TP2/TP1", "host"))
for name in ["tp1", "tp2", "tp2-oldplain", "tp2-trace", "tp2-plan", "tp2-sp16"]:
    j = load(name)
    if not j:
        try:
            err = open(os.path.join(d, name + ".err")).read().strip().splitlines()
        except OSError:
            err = ["not run"]
        print("%-10s failed: %s" % (name, err[-1] if err else "no output"))
        continue
    rel = "%.3fx" % (j["ms_per_token_median"] / base["ms_per_token_median"]) if base else "-"
    print("%-10s %10.3f %8.3fms %7.1f%% %10s %6.1fus" % (name, j["ms_per_token_median"], j.get("roofline_ms", 0),
          100 * j["ratio"], rel, j.get("host_us_per_step", 0)))
PY
