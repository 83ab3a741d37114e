#!/bin/sh
# bench/device/prefix.sh — the prefix cache on the GPU (docs/PERFORMANCE.md "Prefix cache"):
# Llama-3-8B's shape (random weights), 256 prompts of 1024 tokens whose first 896 are the same
# (a long system prompt), 128 output tokens each, with the cache and without; then the
# saturated 128/128 run (512 random prompts: nothing to find) with and without it, for what
# its bookkeeping costs where it finds nothing.
# Usage (repo root, prebuilt build/): OUT=DIR sh bench/device/prefix.sh (~3 min)
# Exits 77 (skipped) on a machine without an NVIDIA GPU.
set -u
BIN=${SF_BIN:-build/semflow}
D=${OUT:-./out}/prefix
mkdir -p "$D"
. bench/device/lib_gpu.sh
need_gpu prefix
"$BIN" hal --json >"$D/hal.json" 2>/dev/null
B="$BIN bench throughput --load-format dummy --preset llama-3-8b --backend cuda --json"
summary() { # output tokens/s, bound ratio, prefix hits of a result
    python3 -c "import json,sys; j=json.load(open(sys.argv[1])); p=j.get('prefix_cache',{}); b=j['bound']; print('%.0f output tokens/s, %.1f total, %.2f s; bound %.1f%% (sustained %.1f%%); cache %s: %d of %d prompt tokens found' % (j['output_tokens_per_s'], j['total_tokens_per_s'], j['elapsed_s'], 100*b['ratio'], 100*b.get('sustained',{}).get('ratio',0), 'on' if p.get('on') else 'off', p.get('hit_tokens',0), p.get('query_tokens',0)))" "$1"
}
for c in on off; do
    f=""; [ $c = off ] && f=--no-prefix-caching
    timeout 240 $B --input 1024 --prefix-len 896 --output 128 --num-prompts 256 $f >"$D/shared-$c.json" 2>"$D/shared-$c.err"
    echo "1024 in (896 shared) / 128 out, 256 prompts, cache $c: $(summary "$D/shared-$c.json")"
done
for c in on off; do
    f=""; [ $c = off ] && f=--no-prefix-caching
    timeout 240 $B --input 128 --output 128 --num-prompts 512 $f >"$D/sat-$c.json" 2>"$D/sat-$c.err"
    echo "128 / 128, 512 prompts, cache $c: $(summary "$D/sat-$c.json")"
done
