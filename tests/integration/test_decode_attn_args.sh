#!/bin/sh
# test_decode_attn --perf TxCTX [PATH] (a profiler's filter) refuses a bad shape or an unknown
# path with a message and status 2, before it looks for a GPU (so this runs anywhere).
T=${SF_BUILD:-build}/tests/device/test_decode_attn
if [ ! -x "$T" ]; then echo "SKIP: $T not built (no CUDA toolkit)"; exit 0; fi
check() { if [ "$2" = 0 ]; then echo "PASS: $1"; else echo "FAIL: $1: $3"; fi; }
for bad in 1x0 0x4096 513x16 1x70000; do
    out=$("$T" --perf "$bad" 2>&1); rc=$?
    ok=1; [ $rc = 2 ] && echo "$out" | grep -q -- "--perf $bad: T 1..512, CTX 1..65536" && ok=0
    check "decode_attn_perf_refuses_shape_$bad" $ok "rc=$rc out=$out"
done
out=$("$T" --perf 1x4120 no-such-path 2>&1); rc=$?
ok=1; [ $rc = 2 ] && echo "$out" | grep -q "no path 'no-such-path'" && ok=0
check decode_attn_perf_refuses_unknown_path $ok "rc=$rc out=$out"
