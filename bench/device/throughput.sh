#!/bin/sh
# bench/device/throughput.sh — GPU sampling and saturated throughput on a GPU host, within 120 s:
#   1. the CUDA sample op against the CPU reference, and its cost by batch size
#      (build/tests/device/test_sample --perf);
#   2. batch-1 decode ms/token on llama-3-8b (dummy weights, 512 context) with the next token drawn
#      by the GPU sampler (only the id crosses PCIe) and chosen on the host (128256 logits copied);
#   3. `semflow bench throughput` on llama-3-8b (graphs for steps of up to 512 tokens, the default), 128 in /
#      128 out with 512 prompts (decode attention: the CUDA-core "lanes" kernel, then the
#      tensor-core "mma" kernel), then 1000 in / 1000 out with 128 prompts (mma).
#      The prompt counts fit the time box; the bound printed beside each is for the same prompts
#      and the same number of running sequences.
# Runs from the repo root with a prebuilt build/; writes under $OUT/throughput/; without a GPU it
# says so and exits 77. The summary table is printed last.
set -u
OUT=${OUT:?set OUT to a folder for the results}/throughput
BIN=${SF_BIN:-build/semflow}
mkdir -p "$OUT"
if ! nvidia-smi -L >/dev/null 2>&1; then echo "throughput: no GPU here (nvidia-smi lists none): skipped"; exit 77; fi
[ -x "$BIN" ] || { echo "throughput: $BIN missing: build first (make)"; exit 1; }
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
left() { l=$(( ${BUDGET:-117} - $(el) )); [ "$l" -gt 5 ] && echo "$l" || echo 5; }

# 1. the sampler op
timeout 30 build/tests/device/test_sample --perf >"$OUT/test_sample.log" 2>&1
echo "throughput: test_sample rc=$? at $(el) s"; cat "$OUT/test_sample.log"

# 2. decode with the GPU sampler vs the host
for where in backend host; do
    timeout 25 "$BIN" bench decode --load-format dummy --preset llama-3-8b --backend cuda --ctx 512 --steps 100 \
        --sample "$where" --json >"$OUT/decode-$where.json" 2>"$OUT/decode-$where.err"
    echo "throughput: decode --sample $where rc=$? at $(el) s"
done

# 3. saturated throughput
run_tp() { # NAME INPUT OUTPUT PROMPTS SECONDS
    timeout "$5" "$BIN" bench throughput --load-format dummy --preset llama-3-8b --backend cuda --input "$2" \
        --output "$3" --num-prompts "$4" --json >"$OUT/$1.json" 2>"$OUT/$1.err"
    echo "throughput: $1 rc=$? at $(el) s"
    tail -n 3 "$OUT/$1.err"
}
# 128/128 with the decode attention kernel of
# each kind (lanes: the CUDA-core kernel; mma: the tensor-core batch kernel), then 1000/1000
(export SEMFLOW_CUDA_DECODE_ATTN=lanes; run_tp tp-128-128-lanes 128 128 512 30)
(export SEMFLOW_CUDA_DECODE_ATTN=mma; run_tp tp-128-128-mma 128 128 512 30)
(export SEMFLOW_CUDA_DECODE_ATTN=mma; run_tp tp-1000-1000-mma 1000 1000 128 "$(left)")

echo "==== throughput summary ($(el) s) ===="
grep -E '^(PASS|FAIL)|differ from|passed' "$OUT/test_sample.log"
grep -A5 '^perf:' "$OUT/test_sample.log"
python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
def load(name):
    try:
        return json.load(open(os.path.join(out, name + ".json")))
    except (OSError, ValueError):
        return None
print("%-28s %10s %10s %8s %10s" % ("decode llama-3-8b ctx 512", "ms/token", "roofline", "share", "host us"))
for w in ("backend", "host"):
    d = load("decode-" + w)
    if d:
        print("%-28s %10.3f %10.3f %7.0f%% %10.0f" % ("sampling on the " + w, d["ms_per_token_median"],
              d.get("roofline_ms", 0), 100 * d["ratio"], d.get("host_us_per_step", 0)))
    else:
        print("%-28s did not finish (see decode-%s.err)" % ("sampling on the " + w, w))
print("%-17s %7s %8s %10s %10s %10s %7s %8s %7s %8s %8s" % ("throughput", "prompts", "running", "out tok/s",
      "total/s", "bound out", "share", "step ms", "host", "enqueue", "replays"))
for name in ("tp-128-128-lanes", "tp-128-128-mma", "tp-1000-1000-mma"):
    r = load(name)
    if r:
        b, e = r["bound"], r["engine"]
        print("%-17s %7d %8d %10.0f %10.0f %10.0f %6.0f%% %8.2f %6.1f%% %7.1f%% %8d" % (name[3:], r["num_prompts"],
              r["max_num_seqs"], r["output_tokens_per_s"], r["total_tokens_per_s"], b["output_tokens_per_s"],
              100 * b["ratio"], e["decode_step_ms"], 100 * e["host_share_decode"], 100 * e["enqueue_share_decode"],
              e.get("graph_replays", 0)))
    else:
        print("%-17s did not finish (see %s.err)" % (name[3:], name))
PY
