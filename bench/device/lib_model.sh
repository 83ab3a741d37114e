# bench/device/lib_model.sh — a Hugging Face folder with Llama-3-8B's shape for `--load-format
# dummy` serving (dummy weights need only config.json; the server needs a tokenizer for text
# prompts), sourced by overload.sh and prefix_serve.sh.
#
# model_8b DIR: writes DIR/config.json and a tokenizer: TinyLlama's from $SF_TESTDATA (else
# ../shared/testdata), else the demo model's (gen-model; more tokens per word). The vocabulary
# is the tokenizer's (32000 for TinyLlama's) instead of Llama-3's 128256, so every token a
# random model samples has text and loadgen can time it: the LM head then reads 0.26 GB a step
# instead of 1.05 GB (about 5% of the 15 GB a decode step reads). Needs BIN. Returns 1 on failure.
model_8b() {
    m=$1
    mkdir -p "$m"
    td=${SF_TESTDATA:-../shared/testdata}
    if [ -f "$td/tinyllama-1.1b-chat-v1.0/tokenizer.json" ]; then
        cp "$td/tinyllama-1.1b-chat-v1.0/tokenizer.json" "$td/tinyllama-1.1b-chat-v1.0/tokenizer_config.json" "$m/" 2>/dev/null
        bos=1 eos=2
    else
        echo "model_8b: no TinyLlama tokenizer under $td; using the demo model's (more tokens per word)"
        timeout 60 "$BIN" gen-model --out "$m.demo" >/dev/null 2>&1 || { echo "model_8b: gen-model failed"; return 1; }
        cp "$m.demo/tokenizer.json" "$m.demo/tokenizer_config.json" "$m/" 2>/dev/null
        bos=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("bos_token_id", 1))' "$m.demo/config.json")
        eos=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("eos_token_id", 2))' "$m.demo/config.json")
    fi
    vocab=$(python3 -c 'import json,sys; t=json.load(open(sys.argv[1])); ids=list(t["model"]["vocab"].values()) + [a["id"] for a in t.get("added_tokens", [])]; print(max(ids) + 1)' "$m/tokenizer.json")
    cat >"$m/config.json" <<EOC
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
 "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": $vocab,
 "max_position_embeddings": 8192, "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "hidden_act": "silu",
 "tie_word_embeddings": false, "torch_dtype": "bfloat16", "bos_token_id": $bos, "eos_token_id": $eos}
EOC
}
