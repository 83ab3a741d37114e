#!/usr/bin/env python3
"""semflow tokenize / detokenize from the outside: ids as HF gives them, round trips, and a
clear error (never a crash) for every bad input."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

BIN = os.environ.get("SEMFLOW_BIN", "build/semflow")
DATA = os.environ.get("SF_TESTDATA") or os.path.realpath(os.path.join(os.getcwd(), "..", "shared", "testdata"))
GPT2 = os.path.join(DATA, "gpt2-tokenizer")
LLAMA = os.path.join(DATA, "tinyllama-1.1b-chat-v1.0")
failed = 0


def run(*args, stdin=None):
    p = subprocess.run([BIN, *args], input=stdin, capture_output=True, timeout=60)
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


def check(name, cond, detail=""):
    global failed
    if cond:
        print(f"PASS: {name}")
    else:
        failed += 1
        print(f"FAIL: {name}: {detail}")


def main():
    inputs = {e["id"]: e["text"] for e in json.load(open(os.path.join(DATA, "tokenizer-conformance", "inputs.json")))}
    for model, base in ((LLAMA, "tinyllama_multilingual.json"), (GPT2, "gpt2_multilingual.json")):
        entries = json.load(open(os.path.join(DATA, "tokenizer-conformance", base)))["entries"][:5]
        bad = []
        for e in entries:
            rc, out, err = run("tokenize", "--model", model, inputs[e["id"]])
            if rc != 0 or json.loads(out) != e["input_ids"]:
                bad.append((e["id"], rc, out.strip(), err.strip()))
                continue
            rc, out, err = run("detokenize", "--model", model, "--skip-special", json.dumps(e["input_ids"]))
            if rc != 0 or out != e["decoded_skip_special"] + "\n":
                bad.append((e["id"], rc, out.strip(), err.strip()))
        check(f"cli_conformance_{os.path.basename(model)}", not bad, repr(bad[:2]))

    rc, out, _ = run("tokenize", "--model", LLAMA, "--no-special", "Hello world")
    check("cli_no_special", rc == 0 and json.loads(out) == [15043, 3186], out)
    rc, out, _ = run("tokenize", "--model", GPT2, "-", stdin="from stdin".encode())
    check("cli_stdin", rc == 0 and json.loads(out) == [6738, 14367, 259], out)
    rc, out, _ = run("detokenize", "--model", LLAMA, "1", "15043", "3186")
    check("cli_detok_ids", rc == 0 and out == "<s> Hello world\n", repr(out))
    gguf = os.path.join(DATA, "llama-2-tiny-random-gguf", "llama-2-tiny-random.gguf")
    rc, out, err = run("tokenize", "--model", gguf, "Hello world")
    check("cli_gguf_tokenize", rc == 0 and json.loads(out) == [1, 15043, 3186], out + err)
    rc, out, err = run("detokenize", "--model", gguf, "--skip-special", "[1, 15043, 3186]")
    check("cli_gguf_detokenize", rc == 0 and out == "Hello world\n", out + err)

    # bad inputs: a clear message and a non-zero status, never a crash
    cases = [
        ("missing_model", ("tokenize", "--model", "/nonexistent-model-dir", "x"), 1, "not found"),
        ("no_text", ("tokenize", "--model", GPT2), 2, "TEXT"),
        ("no_model", ("tokenize", "x"), 2, "--model is required"),
        ("unknown_option", ("tokenize", "--model", GPT2, "--bogus", "x"), 2, "unknown option"),
        ("bad_id", ("detokenize", "--model", GPT2, "12", "abc"), 2, "not a token id"),
        ("bad_json_array", ("detokenize", "--model", GPT2, "[1, 2"), 2, "JSON array"),
        ("id_out_of_range", ("detokenize", "--model", GPT2, "999999"), 1, "not in the vocabulary"),
    ]
    for name, args, want_rc, want_msg in cases:
        rc, out, err = run(*args)
        check("cli_error_" + name, rc == want_rc and want_msg in err, f"rc={rc} stderr={err.strip()!r}")
    p = subprocess.run([BIN, "tokenize", "--model", GPT2, b"ok\xffbad"], capture_output=True, timeout=60)
    check("cli_invalid_utf8", p.returncode == 1 and b"byte offset 2" in p.stderr, p.stderr)
    tmp = tempfile.mkdtemp(prefix="semflow-tok-")
    try:
        bad = os.path.join(tmp, "corrupt")
        os.makedirs(bad)
        with open(os.path.join(bad, "tokenizer.json"), "w") as f:
            f.write('{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []')
        rc, out, err = run("tokenize", "--model", bad, "a")
        check("cli_corrupt_tokenizer_json", rc == 1 and "not valid JSON" in err, err)
        empty = os.path.join(tmp, "empty")
        os.makedirs(empty)
        rc, out, err = run("tokenize", "--model", empty, "a")
        check("cli_missing_tokenizer_json", rc == 1 and "tokenizer.json not found" in err, err)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
