# bench/device/mbatch_common.sh — what mbatch1.sh and mbatch2.sh share (sourced, not run): the
# time box, the no-GPU check, a runner with its own timeout, and the summary's JSON reader.
# The caller sets PART (the results folder's name), LIMIT (seconds in all) and NEED_GPUS.
set -u
T0=$(date +%s)
BIN=${SF_BIN:-build/semflow}
D=${OUT:-/tmp/semflow-$PART}/$PART
mkdir -p "$D"
SUM=$D/summary.txt
: > "$SUM"
export NCCL_NVLS_ENABLE=0
export SEMFLOW_TP_TIMEOUT_MS=${SEMFLOW_TP_TIMEOUT_MS:-20000}

if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
    NGPU=$(echo "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c .)
    nvidia-smi -L >/dev/null 2>&1 || NGPU=0
else
    NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
fi
if [ "${NGPU:-0}" -lt "$NEED_GPUS" ]; then
    echo "$PART: needs $NEED_GPUS GPU(s), ${NGPU:-0} visible: nothing run"
    exit 0
fi
if [ ! -x "$BIN" ]; then
    echo "$PART: $BIN missing: build first (make)"
    exit 0
fi
echo "$PART: $NGPU GPU(s), commit $(cat .devcommit 2>/dev/null || git rev-parse --short HEAD 2>/dev/null), limit $LIMIT s"

left() { echo $((LIMIT - ($(date +%s) - T0))); }

# run NAME MIN_S MAX_S CMD...: skipped when fewer than MIN_S seconds are left; stdout in
# $D/NAME.out, stderr in $D/NAME.err; rc and wall time go to the summary.
run() {
    name=$1 min=$2 max=$3
    shift 3
    l=$(left)
    if [ "$l" -lt "$min" ]; then
        echo "SKIP: $name ($l s left, needs $min)" | tee -a "$SUM"
        return 1
    fi
    lim=$max
    [ "$lim" -gt $((l - 2)) ] && lim=$((l - 2))
    echo "== $name (timeout $lim s) $*"
    t=$(date +%s)
    timeout -k 3 "$lim" "$@" > "$D/$name.out" 2> "$D/$name.err"
    rc=$?
    [ $rc != 0 ] && tail -n 4 "$D/$name.err"
    echo "$name: rc=$rc, $(( $(date +%s) - t )) s" >> "$SUM"
    return $rc
}

# The summary rows of bench JSON results: decode-batch steps (lanes off / on and their ratio)
# and throughput runs (tokens/s against their bound). Arguments: pairs OFF ON of result names.
summary_py() {
    python3 - "$D" "$@" <<'PY'
import json, os, sys
d = sys.argv[1]
def load(n):
    try:
        return json.load(open(os.path.join(d, n + ".out")))
    except (OSError, ValueError):
        return None
args = sys.argv[2:]
for off, on in zip(args[0::2], args[1::2]):
    a, b = load(off), load(on)
    if (a or b or {}).get("mode") == "decode-batch" or (a and "ms_per_step_median" in a) or (b and "ms_per_step_median" in b):
        f = lambda r: "%.3f ms" % r["ms_per_step_median"] if r else "-"
        ratio = "%.3fx" % (b["ms_per_step_median"] / a["ms_per_step_median"]) if a and b else "-"
        print("  %-26s lanes off %-11s on %-11s on/off %s" % (off.replace("-off", ""), f(a), f(b), ratio))
    else:
        f = lambda r: "%.0f tok/s (%.1f%% of %.0f)" % (r["output_tokens_per_s"], 100 * r["bound"]["ratio"],
                                                       r["bound"]["output_tokens_per_s"]) if r else "-"
        ratio = "%.3fx" % (b["output_tokens_per_s"] / a["output_tokens_per_s"]) if a and b else "-"
        print("  %-26s lanes off %-30s on %-30s on/off %s" % (off.replace("-off", ""), f(a), f(b), ratio))
PY
}
