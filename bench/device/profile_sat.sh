#!/bin/sh
# bench/device/profile_sat.sh — where a saturated decode step goes at TP=1 and TP=2, op by op
# (SEMFLOW_CUDA_PROFILE=1: every op timed alone with events, graphs off), beside the same steps with
# graphs on; the batch-1 step at TP=1 and TP=2 the same way; and saturated 128/128 throughput with
# more running sequences than 256 (--max-num-seqs 384 and 512), each with its bound.
# Usage: OUT=DIR sh bench/device/profile_sat.sh (repo root, prebuilt build/); files in $OUT/profsat/.
# Within ~200 s; each run has its own timeout. TP=2 runs are skipped with fewer than 2 GPUs.
set -u
D=${OUT:?set OUT}/profsat
BIN=${SF_BIN:-build/semflow}
mkdir -p "$D"
export NCCL_NVLS_ENABLE=0
export SEMFLOW_TP_TIMEOUT_MS=${SEMFLOW_TP_TIMEOUT_MS:-20000}
n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
r() { # NAME SECONDS CMD...
    name=$1 lim=$2; shift 2
    t=$(date +%s)
    timeout -k 3 "$lim" "$@" > "$D/$name.out" 2> "$D/$name.err"
    echo "== $name rc=$? $(( $(date +%s) - t )) s" | tee -a "$D/summary.txt"
}
P="--load-format dummy --backend cuda --preset llama-3-8b"
B="bench decode-batch $P --batch 256 --ctx 192 --chunk 192 --steps 8 --json"
r b256 30 "$BIN" $B
SEMFLOW_CUDA_PROFILE=1 r b256p 40 "$BIN" $B
SEMFLOW_CUDA_PROFILE=1 r d1p 30 "$BIN" bench decode $P --ctx 512 --steps 16 --json
T="bench throughput $P --input 128 --output 128"
r thr384 40 "$BIN" $T --num-prompts 768 --max-num-seqs 384 --json
r thr512 40 "$BIN" $T --num-prompts 1024 --max-num-seqs 512 --json
if [ "$n" -ge 2 ]; then
    r b256tp2 40 "$BIN" $B --tensor-parallel-size 2
    SEMFLOW_CUDA_PROFILE=1 r b256tp2p 50 "$BIN" $B --tensor-parallel-size 2
    SEMFLOW_CUDA_PROFILE=1 r d1tp2p 40 "$BIN" bench decode $P --ctx 512 --steps 16 --json --tensor-parallel-size 2
fi
for f in "$D"/*.out "$D"/*.err; do echo "---- $f"; tail -n 50 "$f"; done > "$D/all.txt"
grep -h '"decode_step_ms"\|"output_tokens_per_s"\|"ratio"\|ms_per_token\|host_share_decode' "$D"/*.out | head -40
cat "$D/summary.txt"
