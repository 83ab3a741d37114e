#!/bin/sh
# bench/device/kv8.sh — the 8-bit KV cache on a GPU host, within 45 s:
#   1. correctness: the INT8 KV device tests (RoPE + quantised write, every attention path
#      reading INT8 blocks, INT8 block copies) and decode attention timed over a bf16 and an
#      INT8 cache (Llama-3-8B heads, context 4096) against hal's bandwidth
#      (build/tests/device/test_ops --int8);
#   2. quality: `semflow bench kv-quality` on the demo model and on the llama-3-8b dummy
#      preset, CUDA backend (bf16 KV vs INT8 KV, teacher-forced logits, greedy agreement);
#   3. decode at context 4096 with bf16 KV and with INT8 KV (llama-3-8b dummy preset,
#      `bench decode-batch`: batch 1 and 16 sequences), each against its weights + KV roofline.
# Runs from the repo root with a prebuilt build/; writes under $OUT/kv8/; without a GPU it says
# so and exits 77. Steps that would not finish within the 45 s budget are skipped and named.
# The summary table is printed last.
set -u
OUT=${OUT:?set OUT to a folder for the results}/kv8
BIN=${SF_BIN:-build/semflow}
OPS=build/tests/device/test_ops
mkdir -p "$OUT"
if ! nvidia-smi -L >/dev/null 2>&1; then echo "kv8: no GPU here (nvidia-smi lists none): skipped"; exit 77; fi
[ -x "$BIN" ] || { echo "kv8: $BIN missing: build first (make)"; exit 1; }
[ -x "$OPS" ] || { echo "kv8: $OPS missing: build with CUDA first (make)"; exit 1; }
export SEMFLOW_DEMO_DIR=${SEMFLOW_DEMO_DIR:-/tmp/semflow-kv8-demo}
BUDGET=${KV8_BUDGET:-44}
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
# step NAME LIMIT CMD...: runs CMD under timeout when LIMIT seconds are left, else skips it
step() {
    name=$1 lim=$2; shift 2
    left=$(( BUDGET - $(el) ))
    if [ "$left" -lt 4 ]; then echo "kv8: $name skipped: out of time ($(el) s used)"; return; fi
    [ "$lim" -gt "$left" ] && lim=$left
    timeout -k 2 "$lim" "$@" >"$OUT/$name.out" 2>"$OUT/$name.err"
    echo "kv8: $name rc=$? at $(el) s"
}

step ops 12 env SEMFLOW_CUDA_GRAPHS=0 "$OPS" --int8
step quality-demo 6 "$BIN" bench kv-quality --model demo --backend cuda --json
DEC="bench decode-batch --load-format dummy --preset llama-3-8b --backend cuda --ctx 4096 --batch 16 --steps 16 --json"
step decode-bf16 14 "$BIN" $DEC
step decode-int8 14 "$BIN" $DEC --kv-dtype int8
step quality-8b 14 "$BIN" bench kv-quality --load-format dummy --preset llama-3-8b --backend cuda --gen 16 --json

echo "==== kv8 summary ($(el) s) ===="
grep -E '^(PASS|FAIL)|int8' "$OUT/ops.out" 2>/dev/null
python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
def load(name):
    try:
        return json.load(open(os.path.join(out, name + ".out")))
    except (OSError, ValueError):
        return None
print("%-26s %8s %10s %10s %8s %8s %10s %9s %9s" % ("kv-quality (bf16 vs INT8)", "positions", "max|dlog|", "mean|dlog|",
                                                     "rel L2", "top-1", "greedy", "floor L2", "floor t1"))
for name in ("quality-demo", "quality-8b"):
    j = load(name)
    if not j:
        print("%-26s (no result: see %s.err)" % (name, name))
        continue
    print("%-26s %8d %10.4g %10.4g %8.3g %7.1f%% %5d/%-4d %9.3g %8.1f%%" % (j["model"][:26], j["positions"],
          j["max_abs_dlogit"], j["mean_abs_dlogit"], j["rel_l2"], 100 * j["top1_agreement"], j["greedy_same"],
          j["greedy_total"], j.get("floor_rel_l2", -1), 100 * j.get("floor_top1_agreement", -1)))
print("(floor: bf16 KV again with the prompt fed one token per step: what rounding alone changes)")
print("%-30s %10s %12s %12s %8s" % ("decode llama-3-8b, ctx 4096", "ms/step", "KV GB/step", "roofline ms", "ratio"))
rows = {}
for kv in ("bf16", "int8"):
    j = load("decode-" + kv)
    rows[kv] = j
    if not j:
        print("%-30s (no result: see decode-%s.err)" % (kv + " KV", kv))
        continue
    b1 = j["batch1_roofline_ms"]
    print("%-30s %10.3f %12s %12.3f %7.0f%%" % (kv + " KV, batch 1", j["batch1_ms_per_step"], "", b1, 100 * j["batch1_ratio"]))
    print("%-30s %10.3f %12.2f %12.3f %7.0f%%" % ("%s KV, batch %d" % (kv, j["batch"]), j["ms_per_step_median"],
          j["kv_bytes_per_step"] / 1e9, j["roofline_ms"], 100 * j["ratio"]))
if rows["bf16"] and rows["int8"]:
    for k, what in (("batch1_ms_per_step", "batch 1"), ("ms_per_step_median", "batch %d" % rows["bf16"]["batch"])):
        a, b = rows["bf16"][k], rows["int8"][k]
        print("INT8 KV vs bf16 KV, %s: %.3f -> %.3f ms/step (%+.1f%%)" % (what, a, b, 100 * (b / a - 1)))
PY
