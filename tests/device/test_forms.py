#!/usr/bin/env python3
"""Output held to a form on the CUDA backend: `semflow serve` on the demo model with
--backend cuda, requests with guided_regex, a GBNF grammar, a JSON schema with a string pattern
and guided_choice sent at once beside plain ones, so that steps mix rows drawn on the host
(masked) with rows drawn on the GPU. Every held output that ends with "stop" is in its form (the
regular expressions here are written by hand for each); the plain ones run to max_tokens; a form
no token continues is a 400. Prints PASS:/FAIL: lines like the C tests."""
import http.client
import json
import os
import re
import sys
import threading

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
BUILD = os.environ.get("SF_BUILD", os.path.join(os.getcwd(), "build"))
os.environ.setdefault("SEMFLOW_BIN", os.path.join(BUILD, "semflow"))
from sftest import ServerProcess, check, results  # noqa: E402

GRAMMAR = 'root ::= ("yes" | "no") ", " [a-z]{2,6} (" " [a-z]{2,6}){0,2} "."\n'
SCHEMA = {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{2}-\\d{3}$"},
                                           "ok": {"type": "boolean"}}, "required": ["code", "ok"],
          "additionalProperties": False}


def code_ok(text):
    try:
        v = json.loads(text)
    except ValueError:
        return False
    return isinstance(v, dict) and re.fullmatch(r"[A-Z]{2}-\d{3}", v.get("code", "")) is not None and \
        isinstance(v.get("ok"), bool)


CASES = [  # (name, extra request fields, check of a held output)
    ("regex_phone", {"guided_regex": r"\d{3}-\d{4}"}, lambda t: re.fullmatch(r"\d{3}-\d{4}", t)),
    ("regex_email", {"guided_regex": r"[a-z]{1,6}@[a-z]{1,6}\.(com|org)"},
     lambda t: re.fullmatch(r"[a-z]{1,6}@[a-z]{1,6}\.(com|org)", t)),
    ("grammar", {"grammar": GRAMMAR}, lambda t: re.fullmatch(r"(yes|no), [a-z]{2,6}( [a-z]{2,6}){0,2}\.", t)),
    ("schema_pattern", {"response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": SCHEMA}}},
     code_ok),
    ("choice", {"guided_choice": ["positive", "negative", "neutral"]}, lambda t: t in ("positive", "negative", "neutral")),
]


def post(port, body):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    c.request("POST", "/v1/completions", body=json.dumps(body))
    r = c.getresponse()
    data = r.read()
    c.close()
    try:
        return r.status, json.loads(data)
    except ValueError:
        return r.status, {"raw": data[:200]}


def main():
    backend = os.environ.get("SF_FORMS_BACKEND", "cuda")  # cpu: the script's own check, off the GPU
    s = ServerProcess(["--model", "demo", "--backend", backend, "--max-num-seqs", "8", "--max-model-len", "1024"])
    try:
        got = {}

        def run(key, body):
            got[key] = post(s.port, body)

        threads = []
        for i, (name, extra, _) in enumerate(CASES):
            body = dict(extra, prompt="Answer %d:" % i, n=2, temperature=1.0, seed=11 + i, max_tokens=120)
            threads.append(threading.Thread(target=run, args=(name, body)))
        for i in range(4):
            body = {"prompt": "Once upon a time %d" % i, "max_tokens": 64, "temperature": 0, "ignore_eos": True}
            threads.append(threading.Thread(target=run, args=("plain%d" % i, body)))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for name, _, ok in CASES:
            st, r = got.get(name, (0, {}))
            texts = [(c.get("text"), c.get("finish_reason")) for c in r.get("choices", [])]
            check("cuda_%s_held" % name, st == 200 and len(texts) == 2 and
                  all(f == "stop" and ok(t) for t, f in texts), (st, texts, r.get("error")))
        plain = [got.get("plain%d" % i, (0, {})) for i in range(4)]
        check("cuda_plain_beside_held", all(st == 200 and r["usage"]["completion_tokens"] == 64 and
                                            r["choices"][0]["finish_reason"] == "length" for st, r in plain),
              [(st, r.get("usage"), r.get("error")) for st, r in plain])
        st, r = post(s.port, {"prompt": "x", "guided_regex": "\\u00ff\\u00fe", "max_tokens": 5})
        check("cuda_no_token_fits_400", st == 400 and r.get("error", {}).get("code") == "no_token_fits", (st, r))
    finally:
        check("cuda_forms_server_exit_0", s.stop() == 0, s.logtext())
    return 1 if results.failures else 0


if __name__ == "__main__":
    sys.exit(main())
