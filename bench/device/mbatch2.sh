#!/bin/sh
# bench/device/mbatch2.sh — two lanes ($SEMFLOW_LANES=2) under tensor parallelism on 2 GPUs,
# within 95 s (the lead's call gives it 100). Runs from the repo root with a prebuilt build/,
# writes under $OUT/mbatch2/, prints a summary table last; with fewer than 2 GPUs it says so and
# exits 0. First tests/device/test_lanes's TP=2 set (split steps against whole ones, the lanes'
# all-reduces inside the step), then Llama-3-8B dummy at TP=2: `bench decode-batch` 256 x 192
# and `bench throughput` 128 in / 128 out (512 prompts), lanes on, then off where time is left.
PART=mbatch2 LIMIT=${MBATCH2_LIMIT_S:-95} NEED_GPUS=2
. bench/device/mbatch_common.sh

P8="--load-format dummy --preset llama-3-8b --backend cuda --tensor-parallel-size 2"
run test_lanes_tp 15 45 env SEMFLOW_LANES_TEST_TP=1 SEMFLOW_BIN="$BIN" build/tests/device/test_lanes
run d256-on 15 26 env SEMFLOW_LANES=2 "$BIN" bench decode-batch $P8 --batch 256 --ctx 192 --chunk 192 --steps 8 --json
run tp128-on 18 30 env SEMFLOW_LANES=2 "$BIN" bench throughput $P8 --input 128 --output 128 --num-prompts 512 --json
run d256-off 15 26 env SEMFLOW_LANES=0 "$BIN" bench decode-batch $P8 --batch 256 --ctx 192 --chunk 192 --steps 8 --json
run tp128-off 18 30 env SEMFLOW_LANES=0 "$BIN" bench throughput $P8 --input 128 --output 128 --num-prompts 512 --json

echo
echo "==== mbatch2 summary ($(( $(date +%s) - T0 )) s) ===="
cat "$SUM"
grep -hE '^(PASS|FAIL|SKIP)|passed|worst rel|not run' "$D/test_lanes_tp.out" 2>/dev/null
echo "(tp.sh in the same call has the TP=2 runs with lanes off where this box skipped them)"
summary_py d256-off d256-on tp128-off tp128-on
exit 0
