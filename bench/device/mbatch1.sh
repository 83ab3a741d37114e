#!/bin/sh
# bench/device/mbatch1.sh — two lanes (nano-batching, $SEMFLOW_LANES=2) on one GPU, within 145 s
# (the lead's call gives it 150). Runs from the repo root with a prebuilt build/, writes under
# $OUT/mbatch1/, prints a summary table last; without a GPU it says so and exits 0.
#   1. tests/device/test_lanes: split steps (mixed prefill, decode steps captured and replayed
#      as graphs) against whole ones, stories260K and a 4-layer 1b dummy;
#   2. the layer benchmark (test_lanes --bench): Llama-3-8B cut to 4 layers, 256, 512 and 1024
#      sequences x 192 keys: the step whole, split on one stream (what the half-size GEMMs cost alone) and split
#      on two streams (the overlap) with lane 1 starting at once, half a layer or a layer behind
#      ($SEMFLOW_LANES_STAGGER 0 / 1 / 2);
#   3. `bench decode-batch` Llama-3-8B, 256 x 192, 512 x 192 and 128 x 1500, lanes off / on;
#   4. `bench throughput` 128 in / 128 out (512 prompts) and 1000 / 1000 (128 prompts), lanes
#      on / off, each with its bound.
# Every run has its own timeout and is skipped when too little time is left.
PART=mbatch1 LIMIT=${MBATCH1_LIMIT_S:-145} NEED_GPUS=1
. bench/device/mbatch_common.sh

P8="--load-format dummy --preset llama-3-8b --backend cuda"
run test_lanes 15 30 build/tests/device/test_lanes
run layer_bench 15 30 build/tests/device/test_lanes --bench llama-3-8b 4 256 192 30
run layer_bench512 15 30 build/tests/device/test_lanes --bench llama-3-8b 4 512 192 30
run layer_bench1024 15 30 build/tests/device/test_lanes --bench llama-3-8b 4 1024 192 20
# dpair NAME BATCH CTX: `bench decode-batch` at BATCH sequences x CTX keys, lanes off then on
dpair() {
    for l in 0 2; do
        n=$([ $l = 0 ] && echo off || echo on)
        run "$1-$n" 12 22 env SEMFLOW_LANES=$l "$BIN" bench decode-batch $P8 --batch "$2" --ctx "$3" --chunk "$3" \
            --steps 8 --json
    done
}
dpair d256 256 192
dpair d512 512 192
run tp128-on 15 22 env SEMFLOW_LANES=2 "$BIN" bench throughput $P8 --input 128 --output 128 --num-prompts 512 --json
run tp128-off 15 22 env SEMFLOW_LANES=0 "$BIN" bench throughput $P8 --input 128 --output 128 --num-prompts 512 --json
dpair d1500 128 1500
run tp1000-on 25 34 env SEMFLOW_LANES=2 "$BIN" bench throughput $P8 --input 1000 --output 1000 --num-prompts 128 --json
run tp1000-off 25 34 env SEMFLOW_LANES=0 "$BIN" bench throughput $P8 --input 1000 --output 1000 --num-prompts 128 --json

echo
echo "==== mbatch1 summary ($(( $(date +%s) - T0 )) s) ===="
cat "$SUM"
grep -hE '^(PASS|FAIL|SKIP)|passed|worst rel' "$D/test_lanes.out" 2>/dev/null
for b in layer_bench layer_bench512 layer_bench1024; do grep -A6 '^lanes bench' "$D/$b.out" 2>/dev/null; done
summary_py d256-off d256-on d512-off d512-on d1500-off d1500-on tp128-off tp128-on tp1000-off tp1000-on
exit 0
