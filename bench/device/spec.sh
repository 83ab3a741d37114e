#!/bin/sh
# bench/device/spec.sh — n-gram speculative decoding at batch 1 on the GPU (docs/PERFORMANCE.md
# "Speculative decoding"): `semflow generate` with Llama-3-8B's shape (dummy weights,
# lib_model.sh), greedy, OUTPUT tokens, without drafts and with num_speculative_tokens K, on two
# prompts: one that repeats a passage (what n-gram drafts are for: code edits, quoting a
# document) and one that does not. With random weights the output itself soon repeats, which is
# what the acceptance then measures: the figures show what a kept draft token costs and saves on
# this GPU, not how often a trained model's drafts are right. Then what a drafted step costs:
# `bench decode` with its 520-token prompt fed in chunks of 1 + K tokens on top of the context
# before them (what a step with K drafts computes), against its timed one-token decode steps.
# Usage (repo root, prebuilt build/): OUT=DIR sh bench/device/spec.sh (~3 min)
# Env: OUTPUT (256), KS ("4 8"). Exit 77 without a GPU.
set -u
BIN=${SF_BIN:-build/semflow}
D=${OUT:-./out}/spec
OUTPUT=${OUTPUT:-256} KS=${KS:-4 8}
mkdir -p "$D"
. bench/device/lib_gpu.sh
need_gpu spec
. bench/device/lib_model.sh
model_8b "$D/model" || exit 1
passage="The quick brown fox jumps over the lazy dog while the river runs past the old stone garden and the music of the small window plays a green story."
rep="Copy the passage exactly. $passage $passage $passage"
fresh="Write a short story about a lighthouse keeper who finds a map in a bottle."
run() { # name prompt [speculative config]
    name=$1 prompt=$2
    shift 2
    timeout 120 "$BIN" generate --model "$D/model" --load-format dummy --backend cuda --prompt "$prompt" \
        --max-tokens "$OUTPUT" --temperature 0 "$@" >"$D/$name.txt" 2>"$D/$name.err"
    echo "$name: $(grep -o 'decode [0-9.]* tokens/s' "$D/$name.err") $(grep -o '[0-9]* of [0-9]* draft tokens accepted ([0-9.]*%) | [0-9.]* tokens a step' "$D/$name.err")"
}
for p in rep fresh; do
    eval prompt=\$$p
    run "$p-plain" "$prompt"
    for k in $KS; do
        run "$p-spec$k" "$prompt" --speculative-config "{\"method\": \"ngram\", \"num_speculative_tokens\": $k}"
        cmp -s "$D/$p-plain.txt" "$D/$p-spec$k.txt" && echo "  $p-spec$k: the same text as plain" || echo "  $p-spec$k: the text differs from plain (GPU rounding of one-pass drafts)"
    done
done
for k in 1 4 8; do
    c=$((k + 1))
    timeout 120 "$BIN" bench decode --load-format dummy --preset llama-3-8b --backend cuda --ctx 520 --chunk $c \
        --steps 32 >"$D/chunk$c.txt" 2>"$D/chunk$c.err"
    echo "chunks of $c: $(grep -E '^prefill|ms/token' "$D/chunk$c.txt" | tr '\n' ' ')"
done
