#!/usr/bin/env python3
"""`semflow bench kv-quality` and `bench decode --kv-dtype int8` from outside: the JSON a user
(and bench/device/kv8.sh) reads, the text output, a prompt file, and a clear message with exit
status 2 (usage) or 1 (runtime) for every bad input. Quality bounds are a margin under what
stories260K measured (docs/PERFORMANCE.md); timings are never asserted on."""
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from sftest import DATA, check, results, run  # noqa: E402
STORIES = os.path.join(DATA, "stories260K", "stories260K.gguf")
TINY = os.path.join(DATA, "tiny-random-llama-2")

rc, out, err = run("bench", "kv-quality", "--model", STORIES, "--backend", "cpu", "--threads", "1", "--gen", "16",
                   "--json")
try:
    j = json.loads(out)
    ok = (rc == 0 and j["mode"] == "kv-quality" and j["prompts"] == 8 and j["positions"] == 8 * 16
          and j["vocab"] == 512 and j["kv_full"] == "f32" and 0 < j["max_abs_dlogit"] < 5
          and 0 < j["mean_abs_dlogit"] <= j["max_abs_dlogit"] and j["rel_l2"] < 0.05
          and j["top1_agreement"] >= 0.95 and 0 <= j["greedy_same"] <= j["greedy_total"] == 8 * 16
          and j["kv_bytes_per_token_int8"] < j["kv_bytes_per_token_full"]
          and 0 <= j["floor_rel_l2"] <= j["rel_l2"] and 0 <= j["floor_top1_agreement"] <= 1)
    check("kv_quality_json", ok, f"rc {rc}: {out[:400]} {err[:300]}")
except (ValueError, KeyError) as e:
    check("kv_quality_json", False, f"{e}: rc {rc}: {out[:300]} {err[:300]}")

# a model without a tokenizer gets random prompts; the text report names every figure
rc, out, err = run("bench", "kv-quality", "--model", TINY, "--backend", "cpu", "--threads", "1", "--gen", "4")
check("kv_quality_text_no_tokenizer", rc == 0 and "top-1" in out and "relative L2" in out and "INT8" in out,
      f"rc {rc}: {out[:300]} {err[:300]}")

with tempfile.TemporaryDirectory() as d:
    pf = os.path.join(d, "prompts.txt")
    with open(pf, "w") as f:
        f.write("Once upon a time\n\nThe little dog ran\n")
    rc, out, err = run("bench", "kv-quality", "--model", STORIES, "--backend", "cpu", "--threads", "1",
                       "--prompts", pf, "--gen", "4", "--json")
    try:
        j = json.loads(out)
        check("kv_quality_prompt_file", rc == 0 and j["prompts"] == 2 and j["positions"] == 8, out[:300] + err[:300])
    except ValueError as e:
        check("kv_quality_prompt_file", False, f"{e}: rc {rc}: {err[:300]}")
    empty = os.path.join(d, "empty.txt")
    open(empty, "w").close()
    rc, out, err = run("bench", "kv-quality", "--model", STORIES, "--backend", "cpu", "--prompts", empty)
    check("kv_quality_empty_prompt_file", rc == 1 and "no prompts" in err, f"rc {rc}: {err[:300]}")
    rc, out, err = run("bench", "kv-quality", "--model", TINY, "--backend", "cpu", "--prompts", pf)
    check("kv_quality_prompts_need_tokenizer", rc == 1 and "tokenizer" in err, f"rc {rc}: {err[:300]}")

rc, out, err = run("bench", "kv-quality", "--model", STORIES, "--prompts", "/nonexistent/prompts.txt")
check("kv_quality_missing_prompt_file", rc == 1 and "/nonexistent/prompts.txt" in err, f"rc {rc}: {err[:300]}")
rc, out, err = run("bench", "kv-quality", "--model", STORIES, "--gen", "0")
check("kv_quality_bad_gen", rc == 2 and "--gen" in err, f"rc {rc}: {err[:300]}")
rc, out, err = run("bench", "kv-quality", "--model", STORIES, "--backend", "cpu", "--gen", "4000")
check("kv_quality_too_long", rc == 1 and "context" in err, f"rc {rc}: {err[:300]}")
rc, out, err = run("bench", "kv-quality")
check("kv_quality_no_model", rc == 2 and "--model" in err, f"rc {rc}: {err[:300]}")
rc, out, err = run("bench", "kv-quality", "--model", STORIES, "extra")
check("kv_quality_extra_argument", rc == 2 and "extra" in err, f"rc {rc}: {err[:300]}")

# decode with INT8 KV: the KV figures in the JSON, less KV read per step than f32
figs = {}
for kv in ("auto", "int8"):
    rc, out, err = run("bench", "decode", "--model", STORIES, "--backend", "cpu", "--threads", "1", "--ctx", "32",
                       "--steps", "3", "--kv-dtype", kv, "--json")
    try:
        figs[kv] = json.loads(out)
    except ValueError:
        figs[kv] = None
    check("decode_kv_dtype_" + kv, rc == 0 and figs[kv] is not None and figs[kv]["kv_bytes_per_step"] > 0
          and figs[kv]["roofline_weights_kv_ms"] > 0, f"rc {rc}: {out[:300]} {err[:300]}")
if figs["auto"] and figs["int8"]:
    check("decode_int8_reads_less_kv", figs["int8"]["kv_dtype"] == "int8" and figs["auto"]["kv_dtype"] == "f32"
          and figs["int8"]["kv_bytes_per_step"] < figs["auto"]["kv_bytes_per_step"] / 2, str(figs))
rc, out, err = run("bench", "decode", "--model", STORIES, "--kv-dtype", "fp4")
check("decode_bad_kv_dtype", rc == 2 and "--kv-dtype" in err, f"rc {rc}: {err[:300]}")

print(f"{results.passed} passed, {results.failures} failed")
sys.exit(1 if results.failures else 0)
