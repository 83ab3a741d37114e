#!/bin/sh
# bench/device/forms.sh — what requests held to a form, or asking for logprobs, cost a saturated
# step on the GPU (docs/PERFORMANCE.md, "Host-side work"): `semflow bench throughput` on
# Llama-3-8B's shape with random weights and TinyLlama's tokenizer (lib_model.sh), 128 in / 128
# out, with a share of the requests held to JSON output (--structured-output-ratio R), their rows
# drawn by the GPU's sampler with allow masks (the default) or every row of their steps copied to
# the host and drawn there (--sample host, the path before allow masks), and none held (R = 0)
# beside; then every request asking for the top N logprobs (--logprobs N), drawn and scored on
# the GPU or on the host.
# Usage (repo root, prebuilt build/): OUT=DIR sh bench/device/forms.sh (~4 min)
# Env: RATIOS ("0 0.01 0.1"), LOGPROBS ("5 20"; empty: none), SAMPLING ("backend host"), PROMPTS
# (256). Exit 77 without a GPU.
set -u
BIN=${SF_BIN:-build/semflow}
D=${OUT:-./out}/forms
RATIOS=${RATIOS:-0 0.01 0.1} LOGPROBS=${LOGPROBS-5 20} SAMPLING=${SAMPLING:-backend host} PROMPTS=${PROMPTS:-256}
mkdir -p "$D"
. bench/device/lib_gpu.sh
need_gpu forms
. bench/device/lib_model.sh
model_8b "$D/model" || exit 1

field() { # FILE KEY: the first number after "KEY": in a JSON file
    grep -o "\"$2\": *[0-9.e+-]*" "$1" | head -1 | sed 's/.*: *//'
}
run() { # NAME SAMPLING FLAG VALUE: one run and its table line
    f="$D/$1-$2.json"
    timeout 300 "$BIN" bench throughput --model "$D/model" --load-format dummy --backend cuda --input 128 \
        --output 128 --num-prompts "$PROMPTS" "$3" "$4" --sample "$2" --json >"$f" 2>"$f.err"
    rc=$?
    if [ "$rc" != 0 ]; then
        echo "forms: $3 $4, sampling on the $2: exit $rc ($(tail -1 "$f.err"))"
        return
    fi
    printf '%-16s %-8s %14s %14s %10s %9s / %-9s %5s / %-5s %12s %10s %10s %10s\n' "$3 $4" "$2" \
        "$(field "$f" output_tokens_per_s)" "$(field "$f" decode_step_ms)" "$(field "$f" json_requests)" \
        "$(field "$f" rows_sampled_backend)" "$(field "$f" rows_sampled_host)" "$(field "$f" async_form_steps)" \
        "$(field "$f" async_steps)" "$(field "$f" mask_threads)" "$(field "$f" host_share_decode)" \
        "$(field "$f" masks_beside_forward)" "$(field "$f" device_idle_us_per_step)"
}
# host share: the host's gap on its clock over the decode step (forms' masks made beside the
# forward pass left out: the next column, ms a step); device idle: on the device's own clock
printf '%-16s %-8s %14s %14s %10s %s  %s  %s %10s %10s %10s\n' requests sampling "out tokens/s" "decode step ms" \
    "json reqs" "rows (backend / host)" "ahead (forms / all)" "mask threads" "host share" "masks ms" "idle us"
for r in $RATIOS; do
    for s in $SAMPLING; do
        [ "$r" = 0 ] && [ "$s" = host ] && continue
        run "r$r" "$s" --structured-output-ratio "$r"
    done
done
for n in $LOGPROBS; do
    for s in $SAMPLING; do run "lp$n" "$s" --logprobs "$n"; done
done
