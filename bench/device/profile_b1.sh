#!/bin/sh
# bench/device/profile_b1.sh — where a batch-1 decode step goes at TP=1 (Llama-3-8B) and TP=2
# (Llama-3-8B, Llama-3-70B): every op timed alone with events (SEMFLOW_CUDA_PROFILE=1, graphs off),
# beside the graph-on figure of the same run. Usage: OUT=DIR sh bench/device/profile_b1.sh (repo
# root, prebuilt build/); files in $OUT/profb1/. Within ~200 s; each run has its own timeout; the
# TP=2 runs are skipped with fewer than 2 GPUs.
set -u
D=${OUT:?set OUT}/profb1
BIN=${SF_BIN:-build/semflow}
mkdir -p "$D"
export NCCL_NVLS_ENABLE=0
export SEMFLOW_TP_TIMEOUT_MS=${SEMFLOW_TP_TIMEOUT_MS:-30000}
n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
r() { # NAME SECONDS CMD...
    name=$1 lim=$2; shift 2
    t=$(date +%s)
    timeout -k 3 "$lim" "$@" > "$D/$name.out" 2> "$D/$name.err"
    echo "== $name rc=$? $(( $(date +%s) - t )) s" | tee -a "$D/summary.txt"
}
P="bench decode --load-format dummy --backend cuda --ctx 512 --json"
SEMFLOW_CUDA_PROFILE=1 r d8p 30 "$BIN" $P --preset llama-3-8b --steps 16
if [ "$n" -ge 2 ]; then
    r d70 70 "$BIN" $P --preset llama-3-70b --steps 16 --tensor-parallel-size 2
    SEMFLOW_CUDA_PROFILE=1 r d70p 80 "$BIN" $P --preset llama-3-70b --steps 8 --tensor-parallel-size 2
    SEMFLOW_CUDA_PROFILE=1 r d8tp2p 30 "$BIN" $P --preset llama-3-8b --steps 16 --tensor-parallel-size 2
fi
for f in "$D"/*.out "$D"/*.err; do echo "---- $f"; tail -n 40 "$f"; done > "$D/all.txt"
grep -h 'ms_per_token_median\|"ratio"\|roofline_ms' "$D"/*.out | head -20
cat "$D/summary.txt"
