#!/bin/sh
# bench/device/forms.sh — what requests held to a form cost a saturated step on the GPU
# (docs/PERFORMANCE.md, "Host-side work"): `semflow bench throughput` on Llama-3-8B's shape
# with random weights and TinyLlama's tokenizer (lib_model.sh), 128 in / 128 out, with a share
# of the requests held to JSON output (--structured-output-ratio R), their rows drawn by the
# GPU's sampler with allow masks (the default) or every row of their steps copied to the host
# and drawn there (--sample host, the path before allow masks), and none held (R = 0) beside.
# Usage (repo root, prebuilt build/): OUT=DIR sh bench/device/forms.sh (~3 min)
# Env: RATIOS ("0 0.01 0.1"), PROMPTS (256). Exit 77 without a GPU.
set -u
BIN=${SF_BIN:-build/semflow}
D=${OUT:-./out}/forms
RATIOS=${RATIOS:-0 0.01 0.1} PROMPTS=${PROMPTS:-256}
mkdir -p "$D"
. bench/device/lib_gpu.sh
need_gpu forms
. bench/device/lib_model.sh
model_8b "$D/model" || exit 1

field() { # FILE KEY: the first number after "KEY": in a JSON file
    grep -o "\"$2\": *[0-9.e+-]*" "$1" | head -1 | sed 's/.*: *//'
}
printf '%-6s %-8s %14s %14s %10s %s\n' ratio sampling "out tokens/s" "decode step ms" "json reqs" "rows (backend / host)"
for r in $RATIOS; do
    for s in backend host; do
        [ "$r" = 0 ] && [ "$s" = host ] && continue
        f="$D/r$r-$s.json"
        timeout 300 "$BIN" bench throughput --model "$D/model" --load-format dummy --backend cuda --input 128 \
            --output 128 --num-prompts "$PROMPTS" --structured-output-ratio "$r" --sample "$s" --json >"$f" 2>"$f.err"
        rc=$?
        if [ "$rc" != 0 ]; then
            echo "forms: ratio $r, sampling on the $s: exit $rc ($(tail -1 "$f.err"))"
            continue
        fi
        printf '%-6s %-8s %14s %14s %10s %s / %s\n' "$r" "$s" "$(field "$f" output_tokens_per_s)" \
            "$(field "$f" decode_step_ms)" "$(field "$f" json_requests)" "$(field "$f" rows_sampled_backend)" \
            "$(field "$f" rows_sampled_host)"
    done
done
