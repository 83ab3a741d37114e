#!/usr/bin/env python3
"""Whole-model logits of semflow's CUDA backend against Hugging Face transformers (float32 on
the GPU, from the same bf16 weights) for: the tiny-random-llama-2 folder, the demo model, and a
1B-shaped Llama with random weights written here with transformers (bf16 safetensors); and the
demo model's prompt scores (echo with logprobs) and generated tokens' logprobs as `semflow serve`
gives them against transformers' log-softmax.

Every position of a prompt is compared: ||semflow - hf|| / ||hf|| per row (worst row reported)
and the argmax of each row. Needs a GPU host with torch + transformers (the device machine).
Prints PASS:/FAIL: lines like the C tests."""
import os
import subprocess
import sys
import tempfile

import numpy as np

BUILD = os.environ.get("SF_BUILD", os.path.join(os.getcwd(), "build"))
BIN = os.path.join(BUILD, "tests", "device", "test_model")
SEMFLOW = os.environ.get("SEMFLOW_BIN", os.path.join(BUILD, "semflow"))
TESTDATA = os.environ.get("SF_TESTDATA", os.path.abspath("../shared/testdata"))
failed = 0


def report(name, ok, msg=""):
    global failed
    if ok:
        print(f"PASS: {name}")
    else:
        failed += 1
        print(f"FAIL: {name}: {msg}")
    sys.stdout.flush()


def hf_logits(path, ids):
    import torch
    from transformers import AutoModelForCausalLM
    try:
        m = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
    except TypeError:
        m = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32, attn_implementation="eager")
    m = m.cuda().eval()
    with torch.no_grad():
        out = m(torch.tensor([ids], device="cuda")).logits[0].float().cpu().numpy()
    return out


def ours(path, ids, vocab):
    with tempfile.NamedTemporaryFile(suffix=".f32") as f:
        r = subprocess.run([BIN, "--dump", path, ",".join(map(str, ids)), f.name], capture_output=True, text=True)
        if r.returncode:
            raise RuntimeError(f"test_model --dump failed: {r.stderr.strip()[-400:]}")
        return np.fromfile(f.name, dtype=np.float32).reshape(len(ids), vocab)


def compare(name, path, ids, tol):
    try:
        ref = hf_logits(path, ids)
        got = ours(path, ids, ref.shape[1])
    except Exception as e:  # report, do not crash the suite
        report(name, False, f"{type(e).__name__}: {e}")
        return
    rows = [float(np.linalg.norm(got[i] - ref[i]) / np.linalg.norm(ref[i])) for i in range(len(ids))]
    agree = int((got.argmax(1) == ref.argmax(1)).sum())
    worst = max(rows)
    print(f"  {name}: {len(ids)} positions, vocab {ref.shape[1]}: worst row rel err {worst:.2e}, "
          f"mean {np.mean(rows):.2e}, argmax agrees {agree}/{len(ids)}")
    ok = np.isfinite(got).all() and worst < tol and agree >= 0.9 * len(ids)
    report(name, ok, f"worst row rel err {worst:.3g} (tolerance {tol}), argmax {agree}/{len(ids)}")


def served_prompt_logprobs(name, path, ids):
    """The served model's prompt scores (echo, logprobs, max_tokens 0) on the CUDA backend against
    transformers' log-softmax at each position; --max-num-seqs 4, so the prompt is scored 4 rows a
    step over many steps."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
    import http.client
    import json
    os.environ.setdefault("SEMFLOW_BIN", SEMFLOW)
    from sftest import ServerProcess
    try:
        import torch
        ref = torch.log_softmax(torch.tensor(hf_logits(path, ids)), dim=-1).numpy()
        s = ServerProcess(["--model", path, "--backend", "cuda", "--max-num-seqs", "4", "--max-model-len", "512"])
        try:
            c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=120)
            c.request("POST", "/v1/completions", body=json.dumps({"prompt": ids, "echo": True, "max_tokens": 0,
                                                                   "logprobs": 1}))
            r = c.getresponse()
            body = json.loads(r.read())
        finally:
            s.stop()
        got = body["choices"][0]["logprobs"]["token_logprobs"]
    except Exception as e:
        report(name, False, f"{type(e).__name__}: {e}")
        return
    want = [None] + [float(ref[i - 1, ids[i]]) for i in range(1, len(ids))]
    d = [abs(g - w) for g, w in zip(got[1:], want[1:])] if len(got) == len(ids) and got[0] is None else [1e9]
    print(f"  {name}: {len(ids)} positions: worst |logprob - transformers'| {max(d):.3g}, mean {np.mean(d):.3g}")
    report(name, max(d) < 0.1 and np.mean(d) < 0.02, f"worst {max(d):.3g}, mean {np.mean(d):.3g}")


def served_generated_logprobs(name, path, ids):
    """Generated tokens' logprobs as `semflow serve` gives them on the CUDA backend (drawn by the
    GPU's sampler, their log-probabilities and top 5 computed there) against transformers'
    log-softmax over the prompt and the generated tokens: a greedy and a seeded request with
    logprobs sent at once beside two plain ones, so the steps mix rows with and without them."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
    import http.client
    import json
    from concurrent.futures import ThreadPoolExecutor
    os.environ.setdefault("SEMFLOW_BIN", SEMFLOW)
    from sftest import ServerProcess
    reqs = [{"temperature": 0, "logprobs": 5}, {"temperature": 0.8, "seed": 3, "logprobs": 5},
            {"temperature": 0.8, "seed": 4}, {"temperature": 0}]
    try:
        import torch
        s = ServerProcess(["--model", path, "--backend", "cuda", "--max-num-seqs", "8", "--max-model-len", "512"])
        try:
            def one(req):
                c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=120)
                c.request("POST", "/v1/completions", body=json.dumps(dict(req, prompt=ids, max_tokens=24, ignore_eos=True,
                                                                          return_tokens_as_token_ids=True)))
                return json.loads(c.getresponse().read())
            with ThreadPoolExecutor(len(reqs)) as ex:  # sent at once
                bodies = list(ex.map(one, reqs))
        finally:
            s.stop()
        worst, dsum, n, top_worst = 0.0, 0.0, 0, 0.0
        for i, b in enumerate(bodies[:2]):
            lp = b["choices"][0]["logprobs"]
            gen = [int(t.split(":")[1]) for t in lp["tokens"]]
            ref = torch.log_softmax(torch.tensor(hf_logits(path, ids + gen)), dim=-1).numpy()
            for j, g in enumerate(gen):
                row = ref[len(ids) - 1 + j]
                d = abs(lp["token_logprobs"][j] - float(row[g]))
                worst, dsum, n = max(worst, d), dsum + d, n + 1
                got_top = sorted(lp["top_logprobs"][j].values(), reverse=True)
                want_top = np.sort(row)[::-1][:5]
                top_worst = max(top_worst, max(abs(a - w) for a, w in zip(got_top, want_top)) if len(got_top) == 5 else 1e9)
    except Exception as e:
        report(name, False, f"{type(e).__name__}: {e}")
        return
    print(f"  {name}: {n} generated tokens: worst |logprob - transformers'| {worst:.3g}, mean {dsum / max(n, 1):.3g}; "
          f"top 5: worst {top_worst:.3g}")
    report(name, n == 48 and worst < 0.1 and dsum / n < 0.02 and top_worst < 0.1,
           f"{n} tokens, worst {worst:.3g}, mean {dsum / max(n, 1):.3g}, top 5 worst {top_worst:.3g}")


def main():
    import torch
    if not torch.cuda.is_available():
        report("cuda_available", False, "torch sees no GPU")
        return 1
    rng = np.random.default_rng(5)

    tiny = os.path.join(TESTDATA, "tiny-random-llama-2")
    compare("tiny_random_llama2_vs_transformers", tiny, [1, 42, 99] + rng.integers(3, 3000, 29).tolist(), 2e-2)

    demo = os.environ.get("SEMFLOW_DEMO_DIR", os.path.join(BUILD, "demo-model"))
    if not os.path.exists(os.path.join(demo, "config.json")):
        subprocess.run([SEMFLOW, "gen-model", "--out", demo], check=False, capture_output=True)
    import json
    vocab = json.load(open(os.path.join(demo, "config.json")))["vocab_size"]
    compare("demo_model_vs_transformers", demo, rng.integers(0, vocab, 48).tolist(), 3e-2)
    served_prompt_logprobs("demo_model_prompt_logprobs_vs_transformers", demo, rng.integers(0, vocab, 48).tolist())
    served_generated_logprobs("demo_model_generated_logprobs_vs_transformers", demo, rng.integers(0, vocab, 16).tolist())

    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
                      num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048, rope_theta=10000.0,
                      rms_norm_eps=1e-5, tie_word_embeddings=False)
    with tempfile.TemporaryDirectory() as d:
        LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(d, safe_serialization=True)
        compare("random_1b_shape_vs_transformers", d, rng.integers(3, 32000, 64).tolist(), 3e-2)
    print(f"{5 - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
