#!/bin/sh
# bench/device/small_batches.sh — decode steps of 8-32 sequences on the general path (cuBLASLt
# GEMMs or the own 9-32 row kernel, gemm_skinny.cu; docs/PERFORMANCE.md "Steps of 8-32
# sequences"): `bench decode-batch` (Llama-3-8B random bf16 weights) at each batch and context,
# ms a step with the tuner's choice (default), with the own kernel forced wherever it applies
# (SEMFLOW_CUDA_GEMM_OWN_FORCE=1) and without it (SEMFLOW_CUDA_GEMM_OWN=0), the three alternated
# REPS times so the card's drift falls on all. Each configuration tunes into its own cache
# folder. Each run costs ~8 s (model set-up, tuning at the first run).
# Usage (repo root, prebuilt build/): OUT=DIR sh bench/device/small_batches.sh
# Env: BATCHES ("8 16 32"), CTXS ("1024"), REPS (1), MODES ("tuned force off"). Exit 77 without a GPU.
set -u
BIN=${SF_BIN:-build/semflow}
D=${OUT:-./out}/small_batches
BATCHES=${BATCHES:-8 16 32} CTXS=${CTXS:-1024} REPS=${REPS:-1} MODES=${MODES:-tuned force off}
mkdir -p "$D"
. bench/device/lib_gpu.sh
need_gpu small_batches
if [ ! -x "$BIN" ]; then
    echo "small_batches: $BIN is missing: build first (make), or set SF_BIN"
    exit 1
fi
echo "small_batches: $(nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader 2>/dev/null | head -1)"
printf '%-6s %-6s %-4s' batch ctx rep
for m in $MODES; do printf ' %10s' "$m"; done
echo
for c in $CTXS; do
    for b in $BATCHES; do
        r=1
        while [ "$r" -le "$REPS" ]; do
            printf '%-6s %-6s %-4s' "$b" "$c" "$r"
            for m in $MODES; do
                own=1 force=0
                pdl=1
                case $m in force) force=1 ;; force-nopdl) force=1 pdl=0 ;; off) own=0 ;; esac
                mkdir -p "$D/cache_$m"
                XDG_CACHE_HOME="$D/cache_$m" SEMFLOW_CUDA_GEMM_OWN=$own SEMFLOW_CUDA_GEMM_OWN_FORCE=$force \
                    SEMFLOW_CUDA_SKINNY_PDL=$pdl \
                    timeout 120 "$BIN" bench decode-batch --load-format dummy --preset llama-3-8b --backend cuda \
                    --steps 16 --ctx "$c" --chunk "$c" --batch "$b" --json >"$D/${b}_${c}_${m}_$r.json" \
                    2>"$D/${b}_${c}_${m}_$r.err"
                v=$(grep -oE '"ms_per_step_median": ?[0-9.]+' "$D/${b}_${c}_${m}_$r.json" | grep -oE '[0-9.]+$')
                printf ' %10s' "${v:--}"
            done
            echo
            r=$((r + 1))
        done
    done
done
