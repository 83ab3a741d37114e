#!/bin/bash
# Qwen2-7B A/B of SEMFLOW_CUDA_HEAD_DRAW at batch 1, alternated
for r in 1 2; do for c in 512 4096; do for g in 1 0; do
  SEMFLOW_CUDA_HEAD_DRAW=$g timeout 60 build/semflow bench decode --load-format dummy --backend cuda --json --steps 48 --preset qwen2-7b --ctx $c > /tmp/o/q_${c}_${g}_$r.json 2>/tmp/o/q_${c}_${g}_$r.err
  echo "qwen2-7b ctx $c head $g run $r: $(grep -oE '"(ms_per_token_median|ratio|ids_digest)": ?"?[0-9a-f.e-]*' /tmp/o/q_${c}_${g}_$r.json | tr '\n' ' ')"
done; done; done
