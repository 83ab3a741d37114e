#!/bin/sh
# Tensor parallelism from the outside: `semflow generate --tensor-parallel-size N` starts its
# own `semflow rank` followers and greedy text equals TP=1 (demo model, stories260K GGUF), and
# seeded top-k/top-p text too (sampled from the gathered rows on rank 0's backend), and so is
# seeded text held to JSON or to a pattern (the forms' masks sent to every rank after the plan);
# a saturated bench at TP=2 draws requests with forms and logprobs on the backend;
# a size that does not split the heads is refused with a message naming them; no rank
# process outlives its leader; the hidden rank command refuses being run by hand; `bench
# allreduce` and `bench decode` run over rank processes.
BIN=${SEMFLOW_BIN:-build/semflow}
DATA=${SF_TESTDATA:-$(dirname "$0")/../../../shared/testdata}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
check() { if [ "$2" = 0 ]; then echo "PASS: $1"; else echo "FAIL: $1: $3"; fi; }
gen() { # model tp out
    timeout 120 "$BIN" generate --model "$1" --prompt "Once upon a time" --max-tokens 32 --temperature 0 \
        --backend cpu --threads 1 --ignore-eos --tensor-parallel-size "$2" >"$3" 2>"$3.err"
}

for model in demo "$DATA/stories260K/stories260K.gguf"; do
    name=$(basename "$model")
    gen "$model" 1 "$tmp/$name.1"; r1=$?
    for n in 2 4; do
        gen "$model" $n "$tmp/$name.$n"; rn=$?
        ok=1
        [ $r1 = 0 ] && [ $rn = 0 ] && [ -s "$tmp/$name.1" ] && cmp -s "$tmp/$name.1" "$tmp/$name.$n" && ok=0
        check "tp${n}_equals_tp1_$name" $ok "rc $r1/$rn; TP=1: $(head -c 200 "$tmp/$name.1"); TP=$n: $(head -c 200 "$tmp/$name.$n") $(tail -2 "$tmp/$name.$n.err")"
    done
done

# seeded top-k / top-p: rank 0 draws from the gathered rows with the backend's sampler, and the
# draw (a function of seed, step and logits) gives TP=1's text
sgen() { # tp out
    timeout 120 "$BIN" generate --model demo --prompt "Once upon a time" --max-tokens 48 --temperature 0.9 \
        --top-k 40 --top-p 0.9 --seed 11 --backend cpu --threads 1 --ignore-eos --tensor-parallel-size "$1" \
        >"$2" 2>"$2.err"
}
sgen 1 "$tmp/s.1"; r1=$?
sgen 2 "$tmp/s.2"; r2=$?
ok=1
[ $r1 = 0 ] && [ $r2 = 0 ] && [ -s "$tmp/s.1" ] && cmp -s "$tmp/s.1" "$tmp/s.2" && ok=0
check tp2_sampled_equals_tp1_demo $ok "rc $r1/$r2; TP=1: $(head -c 200 "$tmp/s.1"); TP=2: $(head -c 200 "$tmp/s.2") $(tail -2 "$tmp/s.2.err")"

# held to a form: each rank draws with the masks rank 0 made, and the text is TP=1's
fgen() { # model tp out form-flag...
    m=$1 n=$2 o=$3
    shift 3
    timeout 120 "$BIN" generate --model "$m" --prompt "Once upon a time" --max-tokens 40 --temperature 0.8 --seed 3 \
        --backend cpu --threads 1 --tensor-parallel-size "$n" "$@" >"$o" 2>"$o.err"
}
for form in json regex; do
    if [ $form = json ]; then set -- demo --json; else set -- "$DATA/stories260K/stories260K.gguf" --regex '[A-Z][a-z]+( [a-z]+){2,8}\.'; fi
    m=$1
    shift
    fgen "$m" 1 "$tmp/f$form.1" "$@"; r1=$?
    fgen "$m" 2 "$tmp/f$form.2" "$@"; r2=$?
    ok=1
    [ $r1 = 0 ] && [ $r2 = 0 ] && [ -s "$tmp/f$form.1" ] && cmp -s "$tmp/f$form.1" "$tmp/f$form.2" && ok=0
    check "tp2_${form}_equals_tp1" $ok "rc $r1/$r2; TP=1: $(head -c 200 "$tmp/f$form.1"); TP=2: $(head -c 200 "$tmp/f$form.2") $(tail -2 "$tmp/f$form.2.err")"
done

# many requests, half held to JSON and all asking for logprobs: every row drawn on rank 0's
# backend (none copied to the host), the followers drawing the same; the steps with forms' rows
# planned ahead of the ids before them, their masks sent to the followers after the plan
timeout 300 "$BIN" bench throughput --model "$DATA/stories260K/stories260K.gguf" --backend cpu --threads 1 \
    --tensor-parallel-size 2 --input 16 --output 24 --num-prompts 8 --structured-output-ratio 0.5 --logprobs 2 --json \
    >"$tmp/tpf.json" 2>"$tmp/tpf.err"; rc=$?
ok=$(python3 -c '
import json, sys
j = json.load(open(sys.argv[1]))
def find(o, k):
    if isinstance(o, dict):
        if k in o: return o[k]
        for v in o.values():
            r = find(v, k)
            if r is not None: return r
print(0 if find(j, "json_requests") == 4 and find(j, "rows_sampled_host") == 0 and find(j, "rows_sampled_backend") > 0
      and find(j, "async_form_steps") > 0 else 1)' \
    "$tmp/tpf.json" 2>/dev/null || echo 1)
check bench_tp2_forms_logprobs_on_the_backend $ok "rc=$rc $(tail -3 "$tmp/tpf.err") $(head -c 600 "$tmp/tpf.json")"

gen demo 3 "$tmp/bad"; rc=$?
ok=1
[ $rc != 0 ] && grep -q "attention heads" "$tmp/bad.err" && ok=0
check tp_size_not_dividing_heads_refused $ok "rc=$rc: $(cat "$tmp/bad.err")"

sleep 0.2
left=$( (for p in /proc/[0-9]*; do tr '\0' ' ' <"$p/cmdline" 2>/dev/null | grep -q "^$BIN rank " && echo "$p"; done) 2>/dev/null | wc -l)
check no_rank_process_left $([ "$left" = 0 ]; echo $?) "$left rank processes still running"

"$BIN" rank --model demo >/dev/null 2>"$tmp/rank.err"; rc=$?
ok=1
[ $rc = 2 ] && grep -q "started by the leader" "$tmp/rank.err" && ok=0
check rank_by_hand_refused $ok "rc=$rc: $(cat "$tmp/rank.err")"

# bench over rank processes: the all-reduce table and TP decode run and say what they measured
timeout 120 "$BIN" bench allreduce --model demo --backend cpu --threads 1 --tensor-parallel-size 2 --steps 2 --json \
    >"$tmp/ar.json" 2>"$tmp/ar.err"; rc=$?
ok=$(python3 -c '
import json, sys
j = json.load(open(sys.argv[1]))
s = j["sizes"]
print(0 if j["tensor_parallel"] == 2 and len(s) >= 8 and all(x["us"] > 0 and x["bytes"] > 0 for x in s) else 1)' "$tmp/ar.json" 2>/dev/null || echo 1)
check bench_allreduce_table $ok "rc=$rc $(cat "$tmp/ar.err") $(head -c 300 "$tmp/ar.json")"

timeout 120 "$BIN" bench decode-batch --model demo --backend cpu --threads 1 --tensor-parallel-size 2 --batch 4 --ctx 8 \
    --steps 2 --json >"$tmp/db.json" 2>"$tmp/db.err"; rc=$?
ok=$(python3 -c '
import json, sys
j = json.load(open(sys.argv[1]))
print(0 if j["tensor_parallel"] == 2 and j["batch"] == 4 and j["tokens_per_s"] > 0 else 1)' "$tmp/db.json" 2>/dev/null || echo 1)
check bench_decode_batch_tp2 $ok "rc=$rc $(cat "$tmp/db.err") $(head -c 300 "$tmp/db.json")"

# the async loop (rank 0 draws; every rank takes the next token from it) and the serial one
# draw the same ids
timeout 120 "$BIN" bench decode --model demo --backend cpu --threads 1 --tensor-parallel-size 2 --ctx 8 --steps 6 --json \
    >"$tmp/dec.json" 2>"$tmp/dec.err"; rc=$?
timeout 120 "$BIN" bench decode --model demo --backend cpu --threads 1 --tensor-parallel-size 2 --ctx 8 --steps 6 --json \
    --loop serial >"$tmp/decs.json" 2>>"$tmp/dec.err"; rc2=$?
ok=$(python3 -c '
import json, sys
j, k = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
print(0 if j["tensor_parallel"] == 2 and j["ms_per_token_median"] > 0 and j["loop"] == "async" and k["loop"] == "serial"
      and j["ids_digest"] == k["ids_digest"] else 1)' "$tmp/dec.json" "$tmp/decs.json" 2>/dev/null || echo 1)
check bench_decode_tp2 $ok "rc=$rc/$rc2 $(cat "$tmp/dec.err") $(head -c 300 "$tmp/dec.json") $(grep digest "$tmp/decs.json")"
