#!/usr/bin/env python3
"""Writes the seeds of fuzz_gguf and fuzz_safetensors (tests/fuzz/seeds/{gguf,safetensors}):
small but complete models (under 8 KiB, make fuzz's -max_len) that load, so the fuzzer starts
from inputs that reach every stage of the loaders. The safetensors seed matches the config.json
that fuzz_safetensors.c writes. Run from the repository root."""
import json
import struct

H, FF, V, HEADS, KV, HD = 8, 16, 16, 2, 1, 4


def gguf(path, version=3):
    def s(x):
        b = x.encode()
        return struct.pack("<Q", len(b)) + b

    kv = []
    def add(key, typ, payload):
        kv.append(s(key) + struct.pack("<I", typ) + payload)
    add("general.architecture", 8, s("llama"))
    for k, v in [("embedding_length", H), ("block_count", 1), ("feed_forward_length", FF),
                 ("attention.head_count", HEADS), ("attention.head_count_kv", KV),
                 ("rope.dimension_count", HD), ("context_length", 64)]:
        add("llama." + k, 4, struct.pack("<I", v))
    add("llama.attention.layer_norm_rms_epsilon", 6, struct.pack("<f", 1e-5))
    toks = ["<unk>", "<s>", "</s>"] + ["\u2581" + c for c in "abcdefghijklm"]
    add("tokenizer.ggml.model", 8, s("llama"))
    add("tokenizer.ggml.tokens", 9, struct.pack("<IQ", 8, len(toks)) + b"".join(s(t) for t in toks))
    add("tokenizer.ggml.scores", 9, struct.pack("<IQ", 6, len(toks)) + b"".join(struct.pack("<f", -i) for i in range(len(toks))))
    add("tokenizer.ggml.token_type", 9, struct.pack("<IQ", 5, len(toks)) + b"".join(struct.pack("<i", 3 if i < 3 else 1) for i in range(len(toks))))
    for k, v in [("bos_token_id", 1), ("eos_token_id", 2), ("unknown_token_id", 0)]:
        add("tokenizer.ggml." + k, 4, struct.pack("<I", v))
    tensors = [("token_embd.weight", [H, V], True), ("output_norm.weight", [H], False),
               ("blk.0.attn_norm.weight", [H], False), ("blk.0.attn_q.weight", [H, HEADS * HD], True),
               ("blk.0.attn_k.weight", [H, KV * HD], True), ("blk.0.attn_v.weight", [H, KV * HD], True),
               ("blk.0.attn_output.weight", [HEADS * HD, H], True), ("blk.0.ffn_norm.weight", [H], False),
               ("blk.0.ffn_gate.weight", [H, FF], True), ("blk.0.ffn_up.weight", [H, FF], True),
               ("blk.0.ffn_down.weight", [FF, H], True)]
    info, data = b"", b""
    for name, ne, mat in tensors:
        n = 1
        for d in ne:
            n *= d
        typ, blob = 0, b"".join(struct.pack("<f", (i % 7) * 0.01 if mat else 1.0) for i in range(n))
        info += s(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
        info += struct.pack("<IQ", typ, len(data))
        data += blob + b"\0" * (-len(blob) % 32)
    head = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kv)) + b"".join(kv) + info
    head += b"\0" * (-len(head) % 32)
    with open(path, "wb") as f:
        f.write(head + data)


def safetensors(path):
    t = [("model.embed_tokens.weight", [V, H]), ("model.norm.weight", [H]), ("lm_head.weight", [V, H]),
         ("model.layers.0.input_layernorm.weight", [H]), ("model.layers.0.post_attention_layernorm.weight", [H]),
         ("model.layers.0.self_attn.q_proj.weight", [HEADS * HD, H]),
         ("model.layers.0.self_attn.k_proj.weight", [KV * HD, H]),
         ("model.layers.0.self_attn.v_proj.weight", [KV * HD, H]),
         ("model.layers.0.self_attn.o_proj.weight", [H, HEADS * HD]),
         ("model.layers.0.mlp.gate_proj.weight", [FF, H]), ("model.layers.0.mlp.up_proj.weight", [FF, H]),
         ("model.layers.0.mlp.down_proj.weight", [H, FF])]
    hdr, data = {"__metadata__": {"format": "pt"}}, b""
    for name, shape in t:
        n = 1
        for d in shape:
            n *= d
        blob = b"".join(struct.pack("<H", 0x3c00 + i % 5) for i in range(n))
        hdr[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [len(data), len(data) + len(blob)]}
        data += blob
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)


gguf("tests/fuzz/seeds/gguf/tiny-v3.gguf")
gguf("tests/fuzz/seeds/gguf/tiny-v2.gguf", version=2)
safetensors("tests/fuzz/seeds/safetensors/tiny.safetensors")
