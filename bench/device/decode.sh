#!/bin/sh
# bench/device/decode.sh — the CUDA decode figures of docs/PERFORMANCE.md in one go (about 40 s):
# batch-1 decode of the Llama-3-8B and Qwen2-7B shapes (random bf16 weights) at 512 and 4096
# tokens of context, and one 2048-token Llama-3-8B prefill. Each run's JSON goes to
# $OUT/decode/<name>.json, its stderr to <name>.err; a table is printed last.
#
# Usage (repo root, prebuilt build/): OUT=DIR sh bench/device/decode.sh
# Exits 77 (skipped) on a machine without an NVIDIA GPU.
set -u
BIN=${SF_BIN:-build/semflow}
D=${OUT:-./out}/decode
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

# run NAME SECONDS ARGS...: one `semflow bench` with --json, bounded by SECONDS
run() {
    name=$1 lim=$2
    shift 2
    timeout -k 5 "$lim" "$BIN" bench "$@" --backend cuda --load-format dummy --json >"$D/$name.json" 2>"$D/$name.err"
    echo "$name: rc=$? $*" >>"$D/runs.txt"
}
: >"$D/runs.txt"
run llama3-ctx512 12 decode --preset llama-3-8b --ctx 512 --steps 32
run llama3-ctx4096 12 decode --preset llama-3-8b --ctx 4096 --steps 32
run qwen2-ctx512 12 decode --preset qwen2-7b --ctx 512 --steps 32
run qwen2-ctx4096 12 decode --preset qwen2-7b --ctx 4096 --steps 32
run llama3-prefill2048 12 prefill --preset llama-3-8b --ctx 2048 --steps 5
cat "$D/runs.txt"

# the table: one line per run from its JSON (python3 is on the GPU host)
python3 - "$D" <<'PY'
import json, os, sys
d = sys.argv[1]
print("%-20s %10s %10s %10s %8s %9s" % ("run", "ms", "tokens/s", "ceiling", "ratio", "host"))
for name in ["llama3-ctx512", "llama3-ctx4096", "qwen2-ctx512", "qwen2-ctx4096", "llama3-prefill2048"]:
    try:
        j = json.load(open(os.path.join(d, name + ".json")))
    except Exception as e:
        err = open(os.path.join(d, name + ".err")).read().strip().splitlines()
        print("%-20s failed: %s" % (name, err[-1] if err else e))
        continue
    if j.get("mode") == "decode":
        print("%-20s %10.3f %10.1f %9.3fms %7.1f%% %7.1fus" % (name, j["ms_per_token_median"], j["tokens_per_s"],
              j.get("roofline_ms", 0), 100 * j["ratio"], j.get("host_us_per_step", 0)))
    else:
        ms = j.get("ms_median", j.get("ms", 0))
        print("%-20s %10s %10s %10s %8s   %s" % (name, "%.1f" % ms if ms else "-", "%.0f" % j.get("tokens_per_s", 0),
              "-", "%.1f%%" % (100 * j["mfu"]) if "mfu" in j else "-", "MFU"))
PY
