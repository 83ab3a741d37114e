#!/bin/sh
# semflow gen-model from the outside: writes a loadable HF folder, same seed gives the same
# bytes, says the weights are random, and rejects bad arguments with status 2.
BIN=${SEMFLOW_BIN:-build/semflow}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
check() { if [ "$2" = 0 ]; then echo "PASS: $1"; else echo "FAIL: $1: $3"; fi; }

out=$("$BIN" gen-model --out "$tmp/a" --seed 11 2>&1); rc=$?
ok=1
[ $rc = 0 ] && echo "$out" | grep -q "random" && ok=0
for f in config.json generation_config.json model.safetensors tokenizer.json tokenizer_config.json; do
    [ -s "$tmp/a/$f" ] || ok=1
done
check gen_model_writes_folder $ok "rc=$rc out=$out"

"$BIN" gen-model --out "$tmp/b" --seed 11 >/dev/null 2>&1
"$BIN" gen-model --out "$tmp/c" --seed 12 >/dev/null 2>&1
ok=1
cmp -s "$tmp/a/model.safetensors" "$tmp/b/model.safetensors" && cmp -s "$tmp/a/tokenizer.json" "$tmp/b/tokenizer.json" &&
    ! cmp -s "$tmp/a/model.safetensors" "$tmp/c/model.safetensors" && ok=0
check gen_model_deterministic $ok "same seed differs or different seeds agree"

out=$(SEMFLOW_DEMO_DIR="$tmp/demo" "$BIN" gen-model 2>&1); rc=$?
ok=1
[ $rc = 0 ] && [ -s "$tmp/demo/model.safetensors" ] && ok=0
check gen_model_default_dir $ok "rc=$rc out=$out"

"$BIN" gen-model --seed 2>/dev/null; r1=$?
"$BIN" gen-model --out "$tmp/x" --seed banana 2>/dev/null; r2=$?
err=$("$BIN" gen-model --out /proc/nonexistent/x 2>&1); r3=$?
ok=1
[ $r1 = 2 ] && [ $r2 = 2 ] && [ $r3 = 1 ] && echo "$err" | grep -q "/proc/nonexistent" && ok=0
check gen_model_bad_args $ok "rc $r1 $r2 $r3: $err"
