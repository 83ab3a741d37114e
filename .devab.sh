#!/bin/bash
# A/B of SEMFLOW_CUDA_HEAD_DRAW at batch 1, alternated; then one traced run each
for r in 1 2; do for c in 512 4096; do for g in 1 0; do
  SEMFLOW_CUDA_HEAD_DRAW=$g timeout 60 build/semflow bench decode --load-format dummy --backend cuda --json --steps 48 --preset llama-3-8b --ctx $c > /tmp/o/ab_${c}_${g}_$r.json 2>/tmp/o/ab_${c}_${g}_$r.err
  echo "ctx $c head $g run $r: $(grep -oE '"(ms_per_token_median|ratio|ids_digest|device_idle_us_per_step)": ?"?[0-9a-f.e-]*' /tmp/o/ab_${c}_${g}_$r.json | tr '\n' ' ')"
done; done; done
for g in 1 0; do
  SEMFLOW_CUDA_HEAD_DRAW=$g SEMFLOW_CUDA_TRACE=/tmp/o/tr_$g.txt timeout 60 build/semflow bench decode --load-format dummy --backend cuda --json --steps 24 --preset llama-3-8b --ctx 512 > /tmp/o/tr_$g.json 2>&1
  echo "trace head $g:"; python3 bench/device/b1trace.py /tmp/o/tr_$g.txt 2>&1 | grep -E "edge|in it" | head -4; python3 .devtr.py /tmp/o/tr_$g.txt
done
