#!/usr/bin/env python3
"""`semflow hal` and `semflow bench decode` from outside: JSON shape and sane values, the text
output, and exit status 2 with a clear message for every bad flag. Timing values are only
checked to be positive: benchmarks are never asserted on in tests."""
import json
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from sftest import DATA, check, results, run  # noqa: E402
STORIES = os.path.join(DATA, "stories260K", "stories260K.gguf")


rc, out, err = run("hal", "--json")
try:
    hw = json.loads(out)
    cpu = hw["cpu"]
    ok = (rc == 0 and cpu["backend"] == "cpu" and cpu["n_cores"] >= 1 and cpu["l2_bytes"] > 0
          and cpu["mem_total"] > 0 and cpu["mem_read_gbs"] > 0 and cpu["mem_bw_gbs"] > 0
          and cpu["gemm_tflops"] > 0 and cpu["gemm_tflops_sustained"] == cpu["gemm_tflops"] and "cuda" in hw)
    check("hal_json", ok, f"rc {rc}: {out[:300]} {err[:300]}")
except (ValueError, KeyError) as e:
    check("hal_json", False, f"{e}: {out[:300]} {err[:300]}")

rc, out, err = run("hal")
check("hal_text", rc == 0 and "bandwidth" in out and "GB/s read" in out and "cores" in out, out[:300] + err[:300])

rc, out, err = run("bench", "decode", "--model", STORIES, "--backend", "cpu", "--ctx", "8", "--steps", "3", "--json")
try:
    r = json.loads(out)
    ok = (rc == 0 and r["mode"] == "decode" and r["backend"] == "cpu" and r["ctx"] == 8 and r["steps"] == 3
          and r["ms_per_token_median"] > 0 and r["weight_bytes_per_token"] > 1_000_000 and 0 < r["ratio"]
          # every timed interval holds a step (the last one once held only a take: ~0 ms)
          and r["ms_per_token_min"] > r["ms_per_token_median"] / 20
          and r["ceiling"] == "read bandwidth")
    check("bench_decode_json", ok, f"rc {rc}: {out[:400]} {err[-300:]}")
except (ValueError, KeyError) as e:
    check("bench_decode_json", False, f"{e}: {out[:300]} {err[-300:]}")

# The async loop (the default: each step's token taken on the backend from the draw before it)
# draws the same greedy ids as the serial loop and as the host sampler.
digests = {}
for args in (["--loop", "async"], ["--loop", "serial"], ["--sample", "host"]):
    rc, out, err = run("bench", "decode", "--model", STORIES, "--backend", "cpu", "--ctx", "8", "--steps", "24", "--json", *args)
    try:
        r = json.loads(out)
        digests[" ".join(args)] = (rc, r["loop"], r["ids_digest"])
    except (ValueError, KeyError) as e:
        digests[" ".join(args)] = (rc, str(e), err[-200:])
vals = list(digests.values())
check("bench_decode_loops_same_ids", [v[1] for v in vals] == ["async", "serial", "serial"] and all(v[0] == 0 for v in vals)
      and len({v[2] for v in vals}) == 1, str(digests))

# Dummy weights in GGUF's block formats, read in place by the CPU backend: a Q4_K_M model reads
# about a third of the bf16 one's bytes a token, and both loops draw the same greedy ids.
qdir = tempfile.mkdtemp(prefix="sf-q4km-")
with open(os.path.join(qdir, "config.json"), "w") as f:
    json.dump({"model_type": "llama", "vocab_size": 512, "hidden_size": 256, "intermediate_size": 512,
               "num_hidden_layers": 8, "num_attention_heads": 4, "num_key_value_heads": 2}, f)
qb = {}
for fmt, loop in (("bf16", "async"), ("q4_k_m", "async"), ("q4_k_m", "serial")):
    rc, out, err = run("bench", "decode", "--model", qdir, "--load-format", "dummy", "--dtype", fmt, "--backend", "cpu",
                       "--ctx", "8", "--steps", "6", "--loop", loop, "--json")
    try:
        r = json.loads(out)
        qb[(fmt, loop)] = (rc, r["dtype"], r["weight_bytes_per_token"], r["ids_digest"])
    except (ValueError, KeyError) as e:
        qb[(fmt, loop)] = (rc, str(e), 0, err[-300:])
try:
    share = qb[("q4_k_m", "async")][2] / qb[("bf16", "async")][2]
except (ZeroDivisionError, KeyError):
    share = 0
check("bench_decode_dummy_q4_k_m", all(v[0] == 0 for v in qb.values()) and qb[("q4_k_m", "async")][1] == "q4_k"
      and 0.25 < share < 0.4 and qb[("q4_k_m", "async")][3] == qb[("q4_k_m", "serial")][3], f"{qb} share {share:.3f}")
shutil.rmtree(qdir, ignore_errors=True)

rc, out, err = run("bench", "decode", "--model", STORIES, "--backend", "cpu", "--ctx", "0", "--steps", "2")
check("bench_decode_text", rc == 0 and "ms/token" in out and "read bandwidth" in out, out[:400] + err[-300:])

bad = [
    (["bench"], "MODE"),
    (["bench", "prefillz", "--model", STORIES], "unknown mode"),
    (["bench", "decode"], "--model"),
    (["bench", "decode", "--model", STORIES, "--preset", "1b", "--load-format", "dummy"], "either"),
    (["bench", "decode", "--load-format", "dummy", "--preset", "1b", "--ctx", "-3"], "--ctx"),
    (["bench", "decode", "--preset", "1b"], "dummy"),
    (["bench", "decode", "--model", STORIES, "--steps", "abc"], "--steps"),
    (["bench", "decode", "--model", STORIES, "--dtype", "int4", "--load-format", "dummy"], "--dtype"),
    (["bench", "decode", "--model", STORIES, "--load-format", "magic"], "--load-format"),
    (["bench", "decode", "--model", STORIES, "--loop", "sometimes"], "--loop"),
    (["hal", "--frobnicate"], "usage"),
    (["hal", "extra"], "unexpected"),
]
for i, (args, needle) in enumerate(bad):
    rc, out, err = run(*args)
    check(f"usage_{i}_{args[0]}_expects_{needle.strip('-')}", rc == 2 and needle in err,
          f"rc {rc}, stderr: {err[:300]}")

rc, out, err = run("bench", "decode", "--model", "/nonexistent/model", "--backend", "cpu")
check("bench_missing_model", rc == 1 and "/nonexistent/model" in err, f"rc {rc}: {err[:300]}")
rc, out, err = run("bench", "decode", "--model", STORIES, "--backend", "cpu", "--ctx", "5000")
check("bench_ctx_past_model", rc == 1 and "context of 2048" in err, f"rc {rc}: {err[:300]}")
rc, out, err = run("bench", "decode", "--model", STORIES, "--backend", "tpu")
check("bench_bad_backend", rc == 1 and "tpu" in err, f"rc {rc}: {err[:300]}")

print(f"{results.passed} passed, {results.failures} failed")
sys.exit(1 if results.failures else 0)
