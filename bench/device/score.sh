#!/bin/sh
# bench/device/score.sh — prompt scoring on the GPU (docs/PERFORMANCE.md "Prompt scoring"):
#   - test_sample: the score op against the CPU backend's, with its timings (512 rows of 128,256
#     tokens and others);
#   - `semflow perplexity` on TinyLlama-1.1B's shape (random weights, the testdata's tokenizer)
#     over a text of ~14k tokens at --ctx 1024, twice with the backend scoring and twice with
#     the rows scored on the host (SEMFLOW_ENGINE_HOST_SCORE=1), for the ratio.
# Usage (repo root, prebuilt build/): OUT=DIR SF_TESTDATA=DIR sh bench/device/score.sh (~40 s)
# Exits 77 (skipped) on a machine without an NVIDIA GPU.
set -u
BIN=${SF_BIN:-build/semflow}
D=${OUT:-./out}/score
DATA=${SF_TESTDATA:-../shared/testdata}
mkdir -p "$D"
. bench/device/lib_gpu.sh
need_gpu score
M=$DATA/tinyllama-1.1b-chat-v1.0
TEXT=$D/text.txt
: >"$TEXT"
i=0
while [ $i -lt 60 ]; do # a short story, 60 times: ~52 KB, ~14k tokens
    printf '%s\n' "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she saw a big red ball. She wanted to play with it, but it was too high. Lily asked her mom to help her. Her mom said, \"Let's go to the park and play with the ball.\" Lily was so happy. They played with the ball all day long. When it was time to go home, Lily said, \"Thank you, mom. I love you.\" Her mom smiled and gave her a big hug. Once upon a time, there was a little boy named Tom. He had a dog named Max. Max was a good dog. He liked to run and jump. One day, Tom and Max went to the park. They saw a big tree. Tom wanted to climb the tree, but he was scared. Max barked and wagged his tail. Tom felt brave and climbed the tree. He was very happy. The sun was shining and the birds were singing. Tom and Max played all day. At night, they went home and slept. The end." >>"$TEXT"
    i=$((i + 1))
done
"$BIN" hal --json >"$D/hal.json" 2>/dev/null
timeout 60 build/tests/device/test_sample >"$D/test_sample.log" 2>&1
grep -E 'score|^(PASS|FAIL)' "$D/test_sample.log"
for run in 1 2; do
    for env in SEMFLOW_ENGINE_HOST_SCORE=0 SEMFLOW_ENGINE_HOST_SCORE=1; do
        env $env timeout 120 "$BIN" perplexity --model "$M" --load-format dummy --backend cuda --file "$TEXT" --ctx 1024 \
            --json >"$D/ppl-$env-$run.json" 2>"$D/ppl-$env-$run.err"
        echo "perplexity $env run $run: $(cat "$D/ppl-$env-$run.json")"
    done
done
