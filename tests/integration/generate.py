#!/usr/bin/env python3
"""`semflow generate` from outside: streamed text, greedy reference, seeds, stop strings, timing
line, the random-weights notice, and clear exit codes for bad flags."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from sftest import DATA, check, results  # noqa: E402
from sftest import run as run_bin  # noqa: E402


def run(*args, timeout=120):
    return run_bin("generate", *args, timeout=timeout)


STORIES = os.path.join(DATA, "stories260K", "stories260K.gguf")

rc, out, err = run("--model", STORIES, "--prompt", "Once upon a time", "--temperature", "0",
                   "--max-tokens", "30", "--backend", "cpu")
check("greedy_stories", rc == 0 and out.startswith(", there was a little girl named Lily."),
      f"rc {rc} out {out!r} err {err!r}")
check("timing_line", "TTFT" in err and "decode" in err and "finish: length" in err, err)

rc, out, err = run("--model", STORIES, "--prompt", "Once upon a time", "--temperature", "0",
                   "--stop", "named", "--backend", "cpu")
check("stop_string", rc == 0 and out == ", there was a little girl \n" and "finish: stop" in err,
      f"rc {rc} out {out!r}")

a = run("--model", STORIES, "--prompt", "The dog", "--seed", "11", "--temperature", "1", "--max-tokens", "40")
b = run("--model", STORIES, "--prompt", "The dog", "--seed", "11", "--temperature", "1", "--max-tokens", "40")
c = run("--model", STORIES, "--prompt", "The dog", "--seed", "12", "--temperature", "1", "--max-tokens", "40")
check("same_seed_same_text", a[0] == 0 and a[1] == b[1] and len(a[1]) > 10, f"{a[1]!r} vs {b[1]!r}")
check("other_seed_other_text", a[1] != c[1], f"{a[1]!r}")

rc, out, err = run("--model", "demo", "--prompt", "hello", "--max-tokens", "5", "--temperature", "0")
check("demo_random_weights_notice", rc == 0 and "random weights" in err, f"rc {rc} err {err!r}")

import re
rc1, out1, err1 = run("--model", "demo", "--prompt", "hello", "--max-tokens", "3", "--temperature", "0")
rc2, out2, err2 = run("--model", "demo", "--prompt", "hello", "--max-tokens", "3", "--temperature", "0", "--chat")
n1 = re.search(r"prompt (\d+) tokens", err1)
n2 = re.search(r"prompt (\d+) tokens", err2)
check("chat_template_applied", rc1 == 0 and rc2 == 0 and n1 and n2 and int(n2.group(1)) > int(n1.group(1)) + 2,
      f"plain {err1!r} chat {err2!r}")

bad = [
    (["--model", "demo", "--prompt", "x", "--max-tokens", "abc"], 2, "--max-tokens"),
    (["--model", "demo", "--prompt", "x", "--max-tokens", "-3"], 2, "--max-tokens"),
    (["--model", "demo", "--prompt", "x", "--top-p", "2"], 2, "--top-p"),
    (["--model", "demo", "--prompt", "x", "--temperature", "-1"], 2, "--temperature"),
    (["--model", "demo", "--prompt", "x", "--seed", "-5"], 2, "--seed"),
    (["--model", "demo", "--prompt", "x", "--backend", "tpu"], 2, "--backend"),
    (["--model", "demo", "--prompt", "x", "--bogus"], 2, "unknown option"),
    (["--model", "demo", "--prompt"], 2, "needs a value"),
    (["--model", "demo"], 2, "--prompt is required"),
    (["--prompt", "x"], 2, "--model is required"),
    (["--model", "/nonexistent/model", "--prompt", "x"], 1, "not found"),
    (["--model", STORIES, "--prompt", "x " * 100, "--max-model-len", "32"], 2, "shorten the prompt"),
]
for args, want_rc, want_msg in bad:
    rc, out, err = run(*args)
    check(f"bad_flags {' '.join(args)[-48:]}", rc == want_rc and want_msg in err and "Segmentation" not in err,
          f"rc {rc} (want {want_rc}) err {err.strip()!r}")

print(f"{results.passed} passed, {results.failures} failed")
sys.exit(1 if results.failures else 0)
