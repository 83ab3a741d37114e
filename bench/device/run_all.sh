#!/bin/sh
# bench/device/run_all.sh — every part's device script in one call on a GPU host.
#
# Usage (repo root, prebuilt build/): OUT=DIR [PLAN=short] [OVERLOAD=1] [SINGLE=.. SINGLE1=.. DUAL=..]
#   sh bench/device/run_all.sh
# With two GPUs, two lists of single-GPU parts run side by side on GPU 0 and GPU 1; the
# multi-GPU parts (tensor parallelism) then run alone on both, and the eBPF/DMA experiment (BPFDMA=1)
# last on a quiet PCIe link. Each part writes its files under $WORK/<part>/ and its log to
# $WORK/<part>.log; everything is packed into $OUT/devlog.tgz (one file comes back) and a
# summary of exit codes and wall times is printed last.
set -u
OUT=${OUT:?set OUT to a folder for the results}
WORK=${WORK:-/tmp/semflow-devrun}
export SF_TESTDATA=${SF_TESTDATA:-$PWD/.devdata}
export NCCL_NVLS_ENABLE=0
export SF_BIN=${SF_BIN:-$PWD/build/semflow}
rm -rf "$WORK"; mkdir -p "$WORK" "$OUT"
SUMMARY=$WORK/summary.txt
: > "$SUMMARY"

if [ ! -x "$SF_BIN" ]; then echo "run_all: $SF_BIN missing: build first (make)"; exit 1; fi
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
echo "run_all: $NGPU GPU(s), $(nproc) cores, commit $(cat .devcommit 2>/dev/null || git rev-parse --short HEAD 2>/dev/null)"
nvidia-smi --query-gpu=index,name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv 2>/dev/null

# Calibrate hal once per GPU (cached on disk; every part then reads the cache).
for g in $(seq 0 $((NGPU - 1))); do
    CUDA_VISIBLE_DEVICES=$g timeout 60 "$SF_BIN" hal --json > "$WORK/hal-gpu$g.json" 2> "$WORK/hal-gpu$g.err"
done

part() { # part NAME GPUS SECONDS
    name=$1 gpus=$2 lim=$3
    if [ ! -f "bench/device/$name.sh" ]; then echo "$name: no script" >> "$SUMMARY"; return; fi
    t0=$(date +%s)
    OUT=$WORK CUDA_VISIBLE_DEVICES=$gpus timeout -k 10 "$lim" sh "bench/device/$name.sh" > "$WORK/$name.log" 2>&1
    rc=$?
    echo "$name: rc=$rc, $(( $(date +%s) - t0 )) s (limit $lim s, GPUs $gpus)" >> "$SUMMARY"
    echo "---- $name (rc=$rc) ----"; tail -n 25 "$WORK/$name.log"
}

# Single-GPU parts run one after the other on GPU 0 (SINGLE) while those of SINGLE1 run on GPU 1
# (the overload ladder wants a GPU to itself); then the parts of DUAL run alone on both GPUs.
# Each entry is NAME:SECONDS, the part's hard limit.
SINGLE=${SINGLE:-"decode:90 throughput:120"}
SINGLE1=${SINGLE1:-""}
DUAL=${DUAL:-"tp:150"}
[ "${OVERLOAD:-0}" = 1 ] && SINGLE1="overload:300 $SINGLE1"
run_on() { gpus=$1; shift; for p in "$@"; do part "${p%%:*}" "$gpus" "${p#*:}"; done; }
if [ "$NGPU" -ge 2 ]; then
    run_on 0 $SINGLE &
    run_on 1 $SINGLE1 &
    wait
    [ "${PLAN:-full}" = short ] || run_on 0,1 $DUAL
else
    run_on 0 $SINGLE $SINGLE1
fi
[ "${BPFDMA:-0}" = 1 ] && part bpfdma 0 130

tar -C "$WORK" -czf "$OUT/devlog.tgz" . 2>/dev/null
echo "==== summary ===="
cat "$SUMMARY"
