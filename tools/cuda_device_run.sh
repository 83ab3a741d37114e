#!/bin/sh
# One full call on the GPU host: probe, op tests, compute-sanitizer on the op tests, op
# benchmarks, and (when given) model checks and `semflow bench`. Logs go to $OUT (or ./out);
# a short table is printed last. Run from a folder holding build/ and the sources:
#   sh tools/cuda_device_run.sh [ops] [sanitize] [perf] [model] [bench]
# SANITIZE_TESTS: the binaries the sanitize step runs with --quick under memcheck and racecheck
# (default: test_ops test_decode_attn test_sample test_gemv).
OUT=${OUT:-./out}
mkdir -p "$OUT"
BUILD=${BUILD:-build}
steps=${*:-ops sanitize perf}
summary="$OUT/summary.txt"
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem,pcie.link.gen.current,pcie.link.width.current --format=csv >"$OUT/nvidia-smi.txt" 2>&1
for s in $steps; do
    case $s in
    ops)
        t0=$(date +%s)
        "$BUILD"/tests/device/test_ops >"$OUT/ops.log" 2>&1; rc=$?
        note "ops: rc=$rc $(tail -1 "$OUT/ops.log") ($(( $(date +%s) - t0 )) s)"
        grep -E '^(FAIL|  )' "$OUT/ops.log" | head -40 ;;
    sanitize)
        # test_decode_attn: decode attention's own launches (the cluster combine, split groups);
        # test_sample: the draw (bins, radix digits, masks), its logprobs and the score op;
        # test_gemv: the rows kernel (2-6 rows), the one-row fused and persistent-warp kernels
        for tool in memcheck racecheck; do
            for t in ${SANITIZE_TESTS:-test_ops test_decode_attn test_sample test_gemv}; do
                t0=$(date +%s)
                log="$OUT/san-$tool-$t.log"
                timeout 240 compute-sanitizer --tool $tool --error-exitcode 3 "$BUILD"/tests/device/$t --quick >"$log" 2>&1; rc=$?
                note "compute-sanitizer $tool $t: rc=$rc $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1) $(grep -E '^[0-9]+ passed' "$log") ($(( $(date +%s) - t0 )) s)"
            done
        done ;;
    perf)
        "$BUILD"/tests/device/test_ops --perf >"$OUT/perf.log" 2>&1
        grep '^perf:' "$OUT/perf.log" | tee -a "$summary" ;;
    model)
        for t in tests/device/*.py; do
            [ -f "$t" ] || continue
            PYTHONUNBUFFERED=1 timeout 300 python3 "$t" >"$OUT/model-$(basename "$t").log" 2>&1; rc=$?
            note "$t: rc=$rc $(grep -c '^PASS' "$OUT/model-$(basename "$t").log") pass $(grep -c '^FAIL' "$OUT/model-$(basename "$t").log") fail"
            grep -E '^(FAIL|  )' "$OUT/model-$(basename "$t").log" | head -20
        done ;;
    bench)
        for args in "$BENCH_ARGS_1" "$BENCH_ARGS_2" "$BENCH_ARGS_3" "$BENCH_ARGS_4"; do
            [ -n "$args" ] || continue
            echo "== semflow bench $args" >>"$OUT/bench.log"
            timeout 240 "$BUILD"/semflow bench $args >>"$OUT/bench.log" 2>&1
            note "bench $args: rc=$? $(tail -3 "$OUT/bench.log" | tr '\n' ' ')"
        done ;;
    esac
done
echo "==== summary"
cat "$summary"
