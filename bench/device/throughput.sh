#!/bin/sh
# bench/device/throughput.sh — saturated throughput through the engine on one GPU, within 120 s:
#   1. the CUDA sample op against the CPU reference (build/tests/device/test_sample);
#   2. the forward pass alone at the engine's decode shapes (`bench decode-batch`: 256 sequences
#      x 192 keys for 128/128, 128 x 1500 for 1000/1000), the step the engine's is set beside;
#   3. `semflow bench throughput` on llama-3-8b (dummy weights): 128 in / 128 out with 512
#      prompts and 1000 in / 1000 out with 128 prompts, each with the overlapped step loop (the
#      default) and the serial one (SEMFLOW_ENGINE_OVERLAP=0). The prompt counts fit the time
#      box; the bound printed beside each is for the same prompts and running sequences.
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
left() { l=$(( ${BUDGET:-116} - $(el) )); [ "$l" -gt 5 ] && echo "$l" || echo 5; }
cap() { [ "$1" -lt "$(left)" ] && echo "$1" || left; } # SECONDS, or what is left if less

# 1. the sampler op (the engine's draw: sample_start/sample_wait run the same op)
timeout 20 build/tests/device/test_sample >"$OUT/test_sample.log" 2>&1
echo "throughput: test_sample rc=$? at $(el) s"

# 2. the forward pass alone at each run's decode shape
ref() { # NAME BATCH CTX
    timeout "$(cap 20)" "$BIN" bench decode-batch --load-format dummy --preset llama-3-8b --backend cuda --batch "$2" \
        --ctx "$3" --steps 8 --json >"$OUT/$1.json" 2>"$OUT/$1.err"
    echo "throughput: $1 rc=$? at $(el) s"
}
ref ref-256x192 256 192
ref ref-128x1500 128 1500

# 3. saturated throughput, overlapped and serial
run_tp() { # NAME INPUT OUTPUT PROMPTS SECONDS OVERLAP REF
    SEMFLOW_ENGINE_OVERLAP=$6 timeout "$(cap "$5")" "$BIN" bench throughput --load-format dummy --preset llama-3-8b \
        --backend cuda --input "$2" --output "$3" --num-prompts "$4" --compare "$OUT/$7.json" --json \
        >"$OUT/$1.json" 2>"$OUT/$1.err"
    rc=$?
    if [ "$rc" != 0 ] && grep -q -- "--compare" "$OUT/$1.err"; then # no reference: run without it
        SEMFLOW_ENGINE_OVERLAP=$6 timeout "$(cap "$5")" "$BIN" bench throughput --load-format dummy --preset llama-3-8b \
            --backend cuda --input "$2" --output "$3" --num-prompts "$4" --json >"$OUT/$1.json" 2>"$OUT/$1.err"
        rc=$?
    fi
    echo "throughput: $1 rc=$rc at $(el) s"
    grep -E "warm-up|error" "$OUT/$1.err" | tail -n 2
}
run_tp tp-128-128-overlap 128 128 512 20 1 ref-256x192
run_tp tp-128-128-serial 128 128 512 20 0 ref-256x192
run_tp tp-1000-1000-overlap 1000 1000 128 32 1 ref-128x1500
run_tp tp-1000-1000-serial 1000 1000 128 32 0 ref-128x1500

echo "==== throughput summary ($(el) s) ===="
grep -E '^(PASS|FAIL)|passed' "$OUT/test_sample.log"
python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
def load(name):
    try:
        return json.load(open(os.path.join(out, name + ".json")))
    except (OSError, ValueError):
        return None
for n in ("ref-256x192", "ref-128x1500"):
    d = load(n)
    print("%-22s %s" % (n, "%.3f ms/step (forward pass alone, graphs), host %.0f us" % (d["ms_per_step_median"],
          d.get("host_us_per_step", 0)) if d else "did not finish (see %s.err)" % n))
print("%-20s %9s %9s %6s %7s %7s %7s %7s %6s %7s %6s %7s %7s" % ("run", "out tok/s", "bound", "share", "step ms", "median",
      "fwd ms", "x fwd", "host", "gap p50", "work", "deliver", "replays"))
for name in ("tp-128-128-overlap", "tp-128-128-serial", "tp-1000-1000-overlap", "tp-1000-1000-serial"):
    r = load(name)
    if not r:
        print("%-20s did not finish (see %s.err)" % (name[3:], name))
        continue
    b, e = r["bound"], r["engine"]
    d = e.get("decode_batch", {})
    ph = e.get("phases_ms", {})
    print("%-20s %9.0f %9.0f %5.1f%% %7.2f %7.2f %7.2f %7.2f %5.1f%% %7.3f %5.1f%% %7.3f %7d" % (name[3:],
          r["output_tokens_per_s"], b["output_tokens_per_s"], 100 * b["ratio"], e["decode_step_ms"],
          e.get("decode_step_p50_ms", 0), d.get("ms_per_step", 0), d.get("engine_step_over_it", 0),
          100 * e["host_share_decode"], e.get("device_idle_gap_p50_ms", 0), 100 * e.get("host_work_share_decode", 0),
          ph.get("deliver", 0), e.get("graph_replays", 0)))
print("host: the device's idle gap between steps (host on the critical path), share of a decode step; gap p50: its")
print("median in ms; work: all the engine thread's time but its waits; fwd ms: bench decode-batch at the run's decode")
print("shape; x fwd: step / fwd")
PY
