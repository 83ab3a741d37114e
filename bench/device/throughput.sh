#!/bin/sh
# bench/device/throughput.sh — saturated throughput through the engine on one GPU, within 120 s:
#   1. the CUDA sample op against the CPU reference (build/tests/device/test_sample), and the
#      backend side of async scheduling (build/tests/device/test_async_draw: a step whose tokens
#      come from the queued draw before it gives the ids of the same step fed from the host);
#   2. the forward pass alone at the engine's decode shapes (`bench decode-batch`: 512 sequences
#      x 192 keys for 128/128, 128 x 1500 for 1000/1000), the step the engine's is set beside (it
#      reads one logit row and draws none: the engine's step also computes 128-512 rows and draws);
#   3. `semflow bench throughput` on llama-3-8b (dummy weights): 128 in / 128 out with 512
#      prompts (all running at once: --max-num-seqs defaults to 1024), then 1000 in / 1000 out
#      with 128 prompts, each with async scheduling off (SEMFLOW_ENGINE_ASYNC=0) and then on (the
#      default since session 7: the next step queued before the ids of the one in flight reach
#      the host) — each pair in the same call, back to back. Each run prints its
#      bound (same prompts, same seats), its timeline (until every request's first token, every
#      seat decoding, the ramp-down; steps with prompt tokens against decode-only steps) and the
#      device's idle time between steps on its own clock (events: from a step's ids copied back
#      to the next step's first work). Earlier knobs measured and made defaults: 16384-token
#      chunks and SEMFLOW_CUDA_MIXED_DECODE=1 (session 5), the overlapped loop (session 4); last,
#      batch 1 through the engine (one request of 128 in / 512 out) both ways, time allowing;
#   4. (last) build/tests/device/test_env_switches: the CUDA backend's SEMFLOW_* switches refuse a
#      malformed value with a warning naming it.
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

# 1. the sampler op (the engine's draw: sample_start/sample_wait run the same op), and the
#    deferred draws and device-side tokens of async scheduling
timeout 20 build/tests/device/test_sample >"$OUT/test_sample.log" 2>&1
echo "throughput: test_sample rc=$? at $(el) s"
SEMFLOW_CUDA_GEMM_TUNE=0 timeout 20 build/tests/device/test_async_draw >"$OUT/test_async_draw.log" 2>&1
echo "throughput: test_async_draw rc=$? at $(el) s"

# 2. the forward pass alone at each run's decode shape
ref() { # NAME BATCH CTX
    timeout "$(cap 20)" "$BIN" bench decode-batch --load-format dummy --preset llama-3-8b --backend cuda --batch "$2" \
        --ctx "$3" --steps 8 --json >"$OUT/$1.json" 2>"$OUT/$1.err"
    echo "throughput: $1 rc=$? at $(el) s"
}
ref ref-512x192 512 192
ref ref-128x1500 128 1500

# 3. saturated throughput: NAME INPUT OUTPUT PROMPTS SECONDS REF ENV [FLAGS...]
run_tp() {
    name=$1 in=$2 outn=$3 np=$4 secs=$5 refj=$6 envs=$7
    shift 7
    cmp=""
    [ -s "$OUT/$refj.json" ] && cmp="--compare $OUT/$refj.json"
    env $envs timeout "$(cap "$secs")" "$BIN" bench throughput --load-format dummy --preset llama-3-8b --backend cuda \
        --input "$in" --output "$outn" --num-prompts "$np" $cmp --json "$@" >"$OUT/$name.json" 2>"$OUT/$name.err"
    echo "throughput: $name rc=$? at $(el) s"
    grep -E "warm-up|error|warn" "$OUT/$name.err" | tail -n 2
}
# async scheduling off, then on (the default), back to back (A against B inside the call)
run_tp tp-128-128 128 128 512 20 ref-512x192 SEMFLOW_ENGINE_ASYNC=0
run_tp tp-128-128-async 128 128 512 20 ref-512x192 SEMFLOW_ENGINE_ASYNC=1
run_tp tp-1000-1000 1000 1000 128 30 ref-128x1500 SEMFLOW_ENGINE_ASYNC=0
run_tp tp-1000-1000-async 1000 1000 128 30 ref-128x1500 SEMFLOW_ENGINE_ASYNC=1
# batch 1 through the engine (one request, 512 tokens: ~4 ms steps, where the host's 20-40 us
# between steps is ~1% of a step), if the call's seconds allow
run_tp tp-b1 128 512 1 12 none SEMFLOW_ENGINE_ASYNC=0 --max-num-seqs 1
run_tp tp-b1-async 128 512 1 12 none SEMFLOW_ENGINE_ASYNC=1 --max-num-seqs 1

# 4. the CUDA backend's switches refuse malformed values by name (last: it only opens backends)
timeout "$(cap 15)" build/tests/device/test_env_switches >"$OUT/test_env_switches.log" 2>&1
echo "throughput: test_env_switches rc=$? at $(el) s"

echo "==== throughput summary ($(el) s) ===="
grep -E '^(PASS|FAIL)|passed|skipped' "$OUT/test_sample.log" "$OUT/test_async_draw.log" "$OUT/test_env_switches.log" |
    sed 's|^.*/||' 
python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
def load(name):
    try:
        return json.load(open(os.path.join(out, name + ".json")))
    except (OSError, ValueError):
        return None
for n in ("ref-512x192", "ref-128x1500"):
    d = load(n)
    print("%-22s %s" % (n, "%.3f ms/step (forward pass alone, graphs), host %.0f us" % (d["ms_per_step_median"],
          d.get("host_us_per_step", 0)) if d else "did not finish (see %s.err)" % n))
print("%-18s %9s %9s %6s %7s %7s %7s %7s %6s %7s %8s %6s %7s %7s" % ("run", "out tok/s", "bound", "share", "step ms",
      "median", "fwd ms", "x fwd", "host", "gap p50", "dev idle", "ahead", "work", "replays"))
RUNS = ("tp-128-128", "tp-128-128-async", "tp-1000-1000", "tp-1000-1000-async", "tp-b1", "tp-b1-async")
for name in RUNS:
    r = load(name)
    if not r:
        print("%-20s did not finish (see %s.err)" % (name[3:], name))
        continue
    b, e = r["bound"], r["engine"]
    d = e.get("decode_batch", {})
    ph = e.get("phases_ms", {})
    print("%-18s %9.0f %9.0f %5.1f%% %7.2f %7.2f %7.2f %7.2f %5.1f%% %7.3f %8.1f %6d %5.1f%% %7d" % (name[3:],
          r["output_tokens_per_s"], b["output_tokens_per_s"], 100 * b["ratio"], e["decode_step_ms"],
          e.get("decode_step_p50_ms", 0), d.get("ms_per_step", 0), d.get("engine_step_over_it", 0),
          100 * e["host_share_decode"], e.get("device_idle_gap_p50_ms", 0), e.get("device_idle_us_per_step", -1),
          e.get("async_steps", 0), 100 * e.get("host_work_share_decode", 0), e.get("graph_replays", 0)))
print()
print("%-18s %7s %7s %7s %7s | %7s %7s %6s %7s | %7s %7s" % ("timeline (s)", "elapsed", "1st tok", "full", "ramp",
      "prompt", "steps", "decode", "outside", "bnd pf", "bnd dec"))
for name in RUNS:
    r = load(name)
    if not r or "timeline" not in r:
        continue
    t, b = r["timeline"], r["bound"]
    print("%-18s %7.2f %7.2f %7.2f %7.2f | %7.2f %7d %6.2f %7.2f | %7.2f %7.2f" % (name[3:], r["elapsed_s"],
          t["first_tokens_s"], t["full_decode_s"], t["ramp_down_s"], t["prompt_steps_s"], t["prompt_steps"],
          t["decode_steps_s"], t["outside_steps_s"], b["prefill_s"], b["decode_s"]))
print("1st tok: until every request had its first token; full: every seat decoding; ramp: from the first finish to")
print("the last; prompt: time of the steps that carried prompt tokens (steps: how many); decode: decode-only steps;")
print("outside: the run's time outside steps; bnd pf / bnd dec: the bound's prefill and decode seconds")
print("host: the device's idle gap between steps by the host's clock (host on the critical path), share of a decode")
print("step; gap p50: its median in ms; dev idle: the device's idle time from a step's ids to the next step's work")
print("by its own clock (events), us per step; ahead: steps queued before the ids of the one before (async); work:")
print("all the engine thread's time but its waits; fwd ms: bench decode-batch at the run's shape; x fwd: step / fwd")
PY
