#!/bin/sh
# Tensor parallelism on a multi-GPU host (make test-device): the logits check is the test_tp
# binary; this script runs the rest over NCCL: the all-reduce latency table (bench allreduce:
# NCCL and the peer-memory path, 2 KiB .. 16 MiB), `serve --tensor-parallel-size 2` on the
# CUDA backend including a killed rank (NCCL abort: an error, then 503, no hang), and TP=2
# batch-1 decode of the 8B shape next to TP=1.
BIN=${SEMFLOW_BIN:-build/semflow}
check() { if [ "$2" = 0 ]; then echo "PASS: $1"; else echo "FAIL: $1: $3"; fi; }
n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if [ "${n:-0}" -lt 2 ]; then
    echo "      ${n:-0} GPU(s): tensor parallelism needs 2 or more; nothing checked"
    exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

for hidden in 4096 8192; do
    timeout 300 "$BIN" bench allreduce --model demo --backend cuda --tensor-parallel-size 2 --hidden $hidden \
        >"$tmp/ar" 2>"$tmp/ar.err"; rc=$?
    cat "$tmp/ar"
    ok=1
    [ $rc = 0 ] && [ "$(grep -cE '^ +[0-9]+ +[0-9.e+]+ +[0-9.]+ +([0-9.]+|-) +[a-z-]+$' "$tmp/ar")" -ge 14 ] && ok=0
    check "allreduce_table_hidden_$hidden" $ok "rc=$rc $(tail -3 "$tmp/ar.err")"
done

SEMFLOW_TP_BACKEND=cuda python3 "$(dirname "$0")/../integration/test_tp_serve.py"

for tp in 1 2; do
    timeout 600 "$BIN" bench decode --load-format dummy --preset llama-3-8b --backend cuda --ctx 128 --steps 32 \
        --tensor-parallel-size $tp >"$tmp/dec$tp" 2>"$tmp/dec$tp.err"; rc=$?
    cat "$tmp/dec$tp"
    check "decode_8b_tp$tp" $([ $rc = 0 ] && grep -q "^latency" "$tmp/dec$tp"; echo $?) "rc=$rc $(tail -3 "$tmp/dec$tp.err")"
done
