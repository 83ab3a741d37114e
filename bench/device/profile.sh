#!/bin/sh
# bench/device/profile.sh — where device time goes, op by op (SEMFLOW_CUDA_PROFILE=1: each op timed
# alone with events, graphs off; a table by op kind and shape is printed when the backend closes),
# for the shapes the open goals are about, beside the same runs with graphs on:
#   decode-batch llama-3-8b at 256 sequences / 192 keys (128/128 throughput's steady step) and
#   128 sequences / 1500 keys (1000/1000's), batch-1 decode at 512 keys, prefill of 2048 tokens,
#   and with 2 GPUs the TP=2 batch-1 step of llama-3-8b and llama-3-70b.
# Usage: OUT=DIR sh bench/device/profile.sh (repo root, prebuilt build/). Files in $OUT/profile/.
set -u
D=${OUT:?set OUT}/profile
BIN=${SF_BIN:-build/semflow}
mkdir -p "$D"
export NCCL_NVLS_ENABLE=0
which ncu nsys 2>&1 | head -2
n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
r() { # NAME SECONDS CMD...
    name=$1 lim=$2; shift 2
    t=$(date +%s)
    timeout -k 3 "$lim" "$@" > "$D/$name.out" 2> "$D/$name.err"
    echo "== $name rc=$? $(( $(date +%s) - t )) s"
}
P="--load-format dummy --backend cuda"
r b256 40 "$BIN" bench decode-batch $P --preset llama-3-8b --batch 256 --ctx 192 --chunk 192 --steps 8 --json
r b128 40 "$BIN" bench decode-batch $P --preset llama-3-8b --batch 128 --ctx 1500 --chunk 1500 --steps 8 --json
SEMFLOW_CUDA_GRAPH_TOKENS=512 r b256g 40 "$BIN" bench decode-batch $P --preset llama-3-8b --batch 256 --ctx 192 --chunk 192 --steps 8 --json
SEMFLOW_CUDA_PROFILE=1 r b256p 60 "$BIN" bench decode-batch $P --preset llama-3-8b --batch 256 --ctx 192 --chunk 192 --steps 8 --json
SEMFLOW_CUDA_PROFILE=1 r b128p 60 "$BIN" bench decode-batch $P --preset llama-3-8b --batch 128 --ctx 1500 --chunk 1500 --steps 8 --json
SEMFLOW_CUDA_PROFILE=1 r d1p 30 "$BIN" bench decode $P --preset llama-3-8b --ctx 512 --steps 16 --json
SEMFLOW_CUDA_PROFILE=1 r prefillp 30 "$BIN" bench prefill $P --preset llama-3-8b --ctx 2048 --steps 3 --json
if [ "$n" -ge 2 ]; then
    SEMFLOW_CUDA_PROFILE=1 r tp8bp 40 "$BIN" bench decode $P --preset llama-3-8b --tensor-parallel-size 2 --ctx 128 --steps 16 --json
    SEMFLOW_CUDA_PROFILE=1 r tp70bp 80 "$BIN" bench decode $P --preset llama-3-70b --tensor-parallel-size 2 --ctx 128 --steps 8 --json
fi
for f in "$D"/*.out "$D"/*.err; do echo "---- $f"; tail -n 60 "$f"; done
