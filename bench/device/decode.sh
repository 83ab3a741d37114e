#!/bin/sh
# bench/device/decode.sh — the CUDA decode figures of docs/PERFORMANCE.md in one go (about 45 s):
# batch-1 decode of the Llama-3-8B and Qwen2-7B shapes (random bf16 weights) at 512 and 4096
# tokens of context and one 2048-token Llama-3-8B prefill, as the backend runs by default; the
# same decode runs with the fused batch-1 kernels off (SEMFLOW_CUDA_FUSED=0) for comparison;
# and whole-model logits against the CPU backend (build/tests/device/test_model) both ways.
# Each run's JSON goes to $OUT/decode/<name>.json, its stderr to <name>.err; a table is printed
# last.
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
: >"$D/runs.txt"

# correctness first: whole-model logits, CUDA against CPU, fused kernels on and off
MODEL_TEST=${SF_BUILD:-build}/tests/device/test_model
for mode in 1 0; do
    if [ -x "$MODEL_TEST" ]; then
        SEMFLOW_CUDA_FUSED=$mode timeout -k 5 20 "$MODEL_TEST" >"$D/model-fused$mode.log" 2>&1
        echo "test_model fused=$mode: rc=$? $(tail -1 "$D/model-fused$mode.log")" >>"$D/runs.txt"
        grep '^FAIL' "$D/model-fused$mode.log" >>"$D/runs.txt"
    else
        echo "test_model: $MODEL_TEST missing (device tests are built with CUDA)" >>"$D/runs.txt"
    fi
done

# run NAME SECONDS [VAR=VALUE...] ARGS...: one `semflow bench` with --json, bounded by SECONDS
run() {
    name=$1 lim=$2
    shift 2
    timeout -k 5 "$lim" env "$@" --backend cuda --load-format dummy --json >"$D/$name.json" 2>"$D/$name.err"
    echo "$name: rc=$? $*" >>"$D/runs.txt"
}
B="$BIN bench"
run llama3-ctx512 12 $B decode --preset llama-3-8b --ctx 512 --steps 32
run llama3-ctx4096 12 $B decode --preset llama-3-8b --ctx 4096 --steps 32
run qwen2-ctx512 12 $B decode --preset qwen2-7b --ctx 512 --steps 32
run qwen2-ctx4096 12 $B decode --preset qwen2-7b --ctx 4096 --steps 32
run llama3-prefill2048 12 $B prefill --preset llama-3-8b --ctx 2048 --steps 5
run llama3-ctx512-unfused 12 SEMFLOW_CUDA_FUSED=0 $B decode --preset llama-3-8b --ctx 512 --steps 32
run llama3-ctx4096-unfused 12 SEMFLOW_CUDA_FUSED=0 $B decode --preset llama-3-8b --ctx 4096 --steps 32
run qwen2-ctx512-unfused 12 SEMFLOW_CUDA_FUSED=0 $B decode --preset qwen2-7b --ctx 512 --steps 32
run qwen2-ctx4096-unfused 12 SEMFLOW_CUDA_FUSED=0 $B decode --preset qwen2-7b --ctx 4096 --steps 32
cat "$D/runs.txt"

# the table: one line per run from its JSON (python3 is on the GPU host)
python3 - "$D" <<'PY'
import json, os, sys
d = sys.argv[1]
names = ["llama3-ctx512", "llama3-ctx4096", "qwen2-ctx512", "qwen2-ctx4096", "llama3-prefill2048",
         "llama3-ctx512-unfused", "llama3-ctx4096-unfused", "qwen2-ctx512-unfused", "qwen2-ctx4096-unfused"]
print("%-24s %10s %10s %10s %8s %9s" % ("run", "ms", "tokens/s", "roofline", "ratio", "host"))
for name in names:
    try:
        j = json.load(open(os.path.join(d, name + ".json")))
    except Exception as e:
        try:
            err = open(os.path.join(d, name + ".err")).read().strip().splitlines()
        except OSError:
            err = []
        print("%-24s failed: %s" % (name, err[-1] if err else e))
        continue
    if j.get("mode") == "decode":
        print("%-24s %10.3f %10.1f %8.3fms %7.1f%% %7.1fus" % (name, j["ms_per_token_median"], j["tokens_per_s"],
              j.get("roofline_ms", 0), 100 * j["ratio"], j.get("host_us_per_step", 0)))
    else:
        print("%-24s %10.1f %10.0f %10s %7.1f%%   MFU" % (name, j.get("ms_median", 0), j.get("tokens_per_s", 0), "-",
              100 * j.get("mfu", 0)))
PY
