#!/usr/bin/env python3
"""`semflow hal` and `semflow bench decode` from outside: JSON shape and sane values, the text
output, and exit status 2 with a clear message for every bad flag. Timing values are only
checked to be positive: benchmarks are never asserted on in tests."""
import json
import os
import subprocess
import sys

BIN = os.environ.get("SEMFLOW_BIN", "build/semflow")
DATA = os.environ.get("SF_TESTDATA") or os.path.realpath("../shared/testdata")
STORIES = os.path.join(DATA, "stories260K", "stories260K.gguf")
passed = failed = 0


def run(*args, timeout=120):
    p = subprocess.run([BIN, *args], capture_output=True, timeout=timeout)
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


def check(name, ok, detail=""):
    global passed, failed
    if ok:
        passed += 1
        print(f"PASS: {name}")
    else:
        failed += 1
        print(f"FAIL: {name}: {detail}")
    sys.stdout.flush()


rc, out, err = run("hal", "--json")
try:
    hw = json.loads(out)
    cpu = hw["cpu"]
    ok = (rc == 0 and cpu["backend"] == "cpu" and cpu["n_cores"] >= 1 and cpu["l2_bytes"] > 0
          and cpu["mem_total"] > 0 and cpu["mem_read_gbs"] > 0 and cpu["mem_bw_gbs"] > 0
          and cpu["gemm_tflops"] > 0 and "cuda" in hw)
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
          and r["ceiling"] == "read bandwidth")
    check("bench_decode_json", ok, f"rc {rc}: {out[:400]} {err[-300:]}")
except (ValueError, KeyError) as e:
    check("bench_decode_json", False, f"{e}: {out[:300]} {err[-300:]}")

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

print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
