#!/bin/sh
# bench/device/rows.sh — decode steps of several rows (gemv_rows.cu; docs/PERFORMANCE.md "Decode
# steps of 2-6 rows") in one go:
#   - `bench decode-batch` (random bf16 weights, 512 keys) for each preset and batch, ms a step and
#     its share of the weight-read roofline (`bench decode --json`'s roofline_ms: the weights
#     over the bandwidth hal measured); with SF_BASE, that binary's step beside it, the two
#     alternated REPS times (the card's drift falls on both);
#   - `test_gemv --perf-rows ROWS`: each fused GEMV of Llama-3-8B alone at those row counts,
#     planned and at forced ring configurations, in % of the copy bandwidth.
# Each decode-batch run costs ~6 s (model set-up), so 5 batches x 2 presets x 2 reps x 2 binaries
# take ~4 minutes.
# Usage (repo root, prebuilt build/): OUT=DIR [SF_BASE=path/to/other/semflow] sh bench/device/rows.sh
# Env: PRESETS ("llama-3-8b qwen2-7b"), BATCHES ("2 3 4 5 6"), REPS (2), ROWS ("4 5 6 7 8";
# empty: no --perf-rows). Exit 77 without a GPU.
set -u
BIN=${SF_BIN:-build/semflow}
BASE=${SF_BASE:-}
BUILD_DIR=${SF_BUILD:-build}
D=${OUT:-./out}/rows
PRESETS=${PRESETS:-llama-3-8b qwen2-7b} BATCHES=${BATCHES:-2 3 4 5 6} REPS=${REPS:-2} ROWS=${ROWS-4 5 6 7 8}
mkdir -p "$D"
. bench/device/lib_gpu.sh
need_gpu rows
for b in "$BIN" $BASE; do
    if [ ! -x "$b" ]; then
        echo "rows: $b is missing: build first (make), or point SF_BIN / SF_BASE at a binary"
        exit 1
    fi
done

step_ms() { # BINARY PRESET BATCH: the batch's median ms a step, or "-" when the run failed
    "$1" bench decode-batch --load-format dummy --preset "$2" --backend cuda --steps 16 --ctx 512 --batch "$3" \
        >"$D/last.out" 2>"$D/last.err"
    v=$(awk -v b="$3" '$1 == "batch" && $2 == b { print $3 }' "$D/last.out")
    echo "${v:--}"
}
share() { # MS ROOFLINE_MS: the roofline's share of the step, in %
    case $1 in -) echo "-" ;; *) awk -v s="$1" -v r="$2" 'BEGIN { printf "%.1f%%", 100 * r / s }' ;; esac
}

printf '%-12s %5s %-22s %s\n' preset batch "ms a step" "share of the roofline" | tee "$D/table.txt"
for p in $PRESETS; do
    "$BIN" bench decode --load-format dummy --preset "$p" --backend cuda --json --steps 16 --ctx 512 >"$D/$p-b1.json" 2>"$D/$p-b1.err"
    roof=$(grep -o '"roofline_ms": *[0-9.]*' "$D/$p-b1.json" | grep -o '[0-9.]*$')
    if [ -z "$roof" ]; then
        echo "rows: $p: bench decode gave no roofline (see $D/$p-b1.err)"
        continue
    fi
    for bt in $BATCHES; do
        new="" old=""
        r=0
        while [ "$r" -lt "$REPS" ]; do
            new="$new $(step_ms "$BIN" "$p" "$bt")"
            [ -n "$BASE" ] && old="$old $(step_ms "$BASE" "$p" "$bt")"
            r=$((r + 1))
        done
        line=$(printf '%-12s %5s %-22s' "$p" "$bt" "$new")
        for v in $new; do line="$line $(share "$v" "$roof")"; done
        [ -n "$BASE" ] && line="$line   base:$old"
        echo "$line" | tee -a "$D/table.txt"
    done
    echo "$p: roofline $roof ms (bench decode --json)" | tee -a "$D/table.txt"
done
if [ -n "$ROWS" ]; then
    # shellcheck disable=SC2086 # ROWS is a list of row counts
    timeout 200 "$BUILD_DIR/tests/device/test_gemv" --perf-rows $ROWS >"$D/perf-rows.txt" 2>&1
    echo "test_gemv --perf-rows $ROWS: exit $? ($D/perf-rows.txt)"
fi
