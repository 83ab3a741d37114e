#!/usr/bin/env python3
"""`semflow bench throughput` and `bench decode --sample` from outside, on the CPU backend with
small models: the run completes through the engine, every output token is counted, the bound
and the host share are reported, both sampling paths run, requests held to JSON output draw on
the backend, and bad flags exit 2 with a message. Speeds are only checked to be positive."""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from sftest import DATA, check, results, run  # noqa: E402
STORIES = os.path.join(DATA, "stories260K", "stories260K.gguf")


def throughput(*extra):
    rc, out, err = run("bench", "throughput", "--model", "demo", "--backend", "cpu", "--threads", "1",
                       "--input", "12", "--output", "7", "--json", *extra)
    try:
        return rc, json.loads(out), err
    except ValueError:
        return rc, None, out[:300] + err[-300:]


# the overlapped loop (async scheduling off): the host's share of a decode step is the device's
# idle gap between steps, > 0 (async queues the next step first: its host-clock gap reads 0)
os.environ["SEMFLOW_ENGINE_ASYNC"] = "0"
rc, r, err = throughput("--num-prompts", "5")
del os.environ["SEMFLOW_ENGINE_ASYNC"]
ok = (rc == 0 and r and r["mode"] == "throughput" and r["backend"] == "cpu" and r["num_prompts"] == 5
      and r["output_tokens"] == 5 * 7 and r["output_tokens_per_s"] > 0
      and abs(r["total_tokens_per_s"] / r["output_tokens_per_s"] - (12 + 7) / 7) < 1e-6
      and r["bound"]["output_tokens_per_s"] > 0 and 0 < r["bound"]["ratio"]
      # on the CPU the sustained GEMM rate is the measured one, so the second bound is the first
      and abs(r["bound"]["sustained"]["output_tokens_per_s"] / r["bound"]["output_tokens_per_s"] - 1) < 1e-9
      and r["engine"]["decode_steps"] >= 6 and r["engine"]["sampling"] == "backend"
      and r["engine"]["rows_sampled_backend"] == 5 * 7 and 0 < r["engine"]["host_share_decode"] <= 1.0)
check("throughput_cpu_counts_every_token", ok, f"rc {rc}: {r or err}")

# the timeline: every request seated at once, so its three phases add up to the run and its
# tokens to the output (the first tokens come before the "full" phase starts)
tl = (r or {}).get("timeline", {})
ok = (tl and tl["first_tokens_s"] > 0 and tl["ramp_down_s"] >= 0 and tl["full_decode_s"] >= 0
      and abs(tl["first_tokens_s"] + tl["full_decode_s"] + tl["ramp_down_s"] - r["elapsed_s"]) < 1e-6
      and tl["full_decode_tokens"] + tl["ramp_down_tokens"] <= r["output_tokens"] - 5
      and tl["prompt_steps"] >= 1 and tl["prompt_steps_s"] > 0 and tl["decode_steps_s"] > 0
      and tl["prompt_steps_s"] + tl["decode_steps_s"] + tl["outside_steps_s"] >= 0.99 * r["elapsed_s"])
check("throughput_timeline_adds_up", ok, f"{tl}")

# async scheduling (the default): every output token still counted, its steps queued ahead of
# the ids of the step before them, and the report says so
rc, r, err = throughput("--num-prompts", "5", "--max-num-seqs", "3")
e = r["engine"] if r else {}
check("throughput_async", rc == 0 and r and r["output_tokens"] == 5 * 7 and e.get("async") is True
      and e.get("async_steps", 0) >= 6 and e.get("overlapped") is True, f"rc {rc}: {e or err}")

# more requests than may run at once: the scheduler queues the rest
rc, r, err = throughput("--num-prompts", "9", "--max-num-seqs", "4", "--temperature", "0", "--sample", "host")
ok = (rc == 0 and r and r["output_tokens"] == 9 * 7 and r["max_num_seqs"] == 4
      and r["engine"]["sampling"] == "host" and r["engine"]["mean_decode_batch"] <= 4)
check("throughput_queues_beyond_max_num_seqs_host_sampling", ok, f"rc {rc}: {r or err}")

# truncated sampling for every request: each output token counted, the report says what was asked
rc, r, err = throughput("--num-prompts", "4", "--top-p", "0.9", "--top-k", "40")
check("throughput_top_p_top_k", rc == 0 and r and r["output_tokens"] == 4 * 7
      and r["sampling"] == {"temperature": 1.0, "top_p": 0.9, "top_k": 40, "structured_output_ratio": 0.0,
                            "logprobs": None}
      and r["engine"]["sampling"] == "backend", f"rc {rc}: {r or err}")

# half the requests held to JSON output: they end with their object (up to --output tokens), the
# others run to --output, and every row is still drawn by the backend's sampler (with the masks)
rc, r, err = throughput("--num-prompts", "6", "--structured-output-ratio", "0.5")
e = r["engine"] if r else {}
check("throughput_structured_output", rc == 0 and r and r["json_requests"] == 3
      and 3 * 7 < r["output_tokens"] <= 6 * 7 and r["sampling"]["structured_output_ratio"] == 0.5
      and e.get("sampling") == "backend" and e.get("rows_sampled_host") == 0, f"rc {rc}: {r or err}")
# the CPU backend runs a step's forward pass inside its launch, before the masks: none of their
# time is beside a forward pass, all of it is in the host's gap (on a GPU: tests/device)
check("throughput_structured_output_masks_in_the_gap", e.get("phases_ms", {}).get("masks_beside_forward") == 0,
      f"{e.get('phases_ms')}")

# every request with its tokens' logprobs and the top 5: the rows still drawn by the backend's
# sampler, which gives the log-probabilities with the ids
rc, r, err = throughput("--num-prompts", "4", "--logprobs", "5")
e = r["engine"] if r else {}
check("throughput_logprobs", rc == 0 and r and r["output_tokens"] == 4 * 7 and r["sampling"]["logprobs"] == 5
      and e.get("sampling") == "backend" and e.get("rows_sampled_host") == 0, f"rc {rc}: {r or err}")

rc, out, err = run("bench", "throughput", "--model", "demo", "--backend", "cpu", "--threads", "1",
                   "--input", "8", "--output", "4", "--num-prompts", "2")
check("throughput_text", rc == 0 and "output tokens/s" in out and "bound" in out and "host" in out,
      out[:400] + err[-300:])

# decode with the next token drawn by the backend's sampler or chosen on the host
dec = {}
for where in ("backend", "host"):
    rc, out, err = run("bench", "decode", "--model", STORIES, "--backend", "cpu", "--ctx", "4", "--steps", "3",
                       "--sample", where, "--json")
    try:
        dec[where] = json.loads(out)
    except ValueError:
        dec[where] = {"rc": rc, "err": err[-300:]}
check("decode_sample_paths", all(dec[w].get("sampling") == w and dec[w].get("ms_per_token_median", 0) > 0
                                 for w in dec), str(dec)[:500])

for args, what in [
    (["--input", "0"], "--input"),
    (["--output", "x"], "--output"),
    (["--num-prompts", "-1"], "--num-prompts"),
    (["--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization"),
    (["--temperature", "nan"], "--temperature"),
    (["--sample", "gpu"], "--sample"),
    (["--top-p", "0"], "--top-p"),
    (["--top-p", "1.01"], "--top-p"),
    (["--top-k", "-1"], "--top-k"),
    (["--batch", "0"], "--batch"),
    (["--kv-dtype", "fp4"], "--kv-dtype"),
    (["--max-batched-tokens", "0"], "--max-batched-tokens"),
    (["--max-num-seqs", "12x"], "--max-num-seqs"),
    (["--structured-output-ratio", "1.5"], "--structured-output-ratio"),
    (["--structured-output-ratio", "half"], "--structured-output-ratio"),
    (["--logprobs", "21"], "--logprobs"),
    (["--logprobs", "-1"], "--logprobs"),
]:
    rc, out, err = run("bench", "throughput", "--model", "demo", "--backend", "cpu", *args)
    check("bad_flag " + " ".join(args), rc == 2 and what in err, f"rc {rc}: {err[-300:]}")

# JSON output needs the tokenizer's texts, which a preset has not: refused before its weights are made
rc, out, err = run("bench", "throughput", "--load-format", "dummy", "--preset", "llama-3-70b", "--backend", "cpu",
                   "--structured-output-ratio", "0.1")
check("structured_output_needs_a_tokenizer", rc == 2 and "--structured-output-ratio needs a tokenizer" in err,
      f"rc {rc}: {err[-300:]}")

rc, out, err = run("bench", "throughput", "--model", "demo", "--backend", "cpu", "--input", "10", "--prefix-len", "11")
check("prefix_len_over_input", rc != 0 and "--prefix-len 11 is longer than --input 10" in err, f"rc {rc}: {err[-300:]}")
rc, out, err = run("bench", "throughput", "--model", "demo", "--backend", "cpu", "--prefix-len", "-1")
check("bad_flag --prefix-len -1", rc == 2 and "--prefix-len" in err, f"rc {rc}: {err[-300:]}")

rc, out, err = run("bench", "throughput", "--model", "demo", "--backend", "cpu", "--input", "4000", "--output", "4000")
check("context_too_long", rc == 1 and "--input" in err and "context" in err, f"rc {rc}: {err[-300:]}")

# --compare takes a decode-batch JSON file: a missing or malformed one is refused with what to give
bad = os.path.join(os.environ.get("TMPDIR", "/tmp"), "sf-compare-bad-%d.json" % os.getpid())
wrong = bad + ".decode.json"
with open(bad, "w") as f:
    f.write("{bad")
with open(wrong, "w") as f:
    f.write('{"mode": "decode", "ms_per_token_median": 1.0}')
for path in [bad, bad + ".missing", wrong]:
    rc, out, err = run("bench", "throughput", "--model", "demo", "--backend", "cpu", "--input", "4", "--output", "2",
                       "--num-prompts", "2", "--compare", path)
    check("bad_compare_file " + os.path.basename(path), rc != 0 and "--compare" in err and "decode-batch" in err,
          f"rc {rc}: {err[-300:]}")
os.unlink(bad)
os.unlink(wrong)

print(f"{results.passed} passed, {results.failures} failed")
sys.exit(1 if results.failures else 0)
