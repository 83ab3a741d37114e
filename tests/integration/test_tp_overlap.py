#!/usr/bin/env python3
"""The overlapped engine loop at tensor parallelism 2 (CPU ranks): `semflow serve
--tensor-parallel-size 2` with the loop overlapped (the default) and serial
(SEMFLOW_ENGINE_OVERLAP=0) answers the same 10 concurrent seeded completions (temperature,
top-k, top-p, penalties, stop strings, max_tokens, more requests than seats) with the same
text, finish reasons and token counts, on stories260K (a trained model, so stop strings and
EOS fire)."""
import http.client
import json
import os
import sys
import threading

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from sftest import DATA, ServerProcess, check, results  # noqa: E402

MODEL = os.path.join(DATA, "stories260K", "stories260K.gguf")


def body(i):
    b = {"model": "stories260K", "prompt": ["Once upon a time", "The little dog", "Lily and Ben", "One day, Tom"][i % 4],
         "max_tokens": 8 + (i * 13) % 40, "temperature": 0.7 + 0.1 * (i % 3), "seed": 500 + i}
    if i % 3 == 1:
        b["top_k"] = 8
    if i % 4 == 2:
        b["top_p"] = 0.9
    if i % 5 == 3:
        b["presence_penalty"] = 0.6
    if i % 2 == 1:
        b["stop"] = ["." if i % 4 == 1 else " the"]
    return b


def run(overlap):
    env = dict(os.environ, SEMFLOW_TP_TIMEOUT_MS="20000", SEMFLOW_ENGINE_OVERLAP="1" if overlap else "0")
    srv = ServerProcess(["--model", MODEL, "--backend", "cpu", "--threads", "1", "--workers", "1", "--bpf", "off",
                         "--max-num-seqs", "4", "--max-batched-tokens", "128", "--tensor-parallel-size", "2"],
                        env=env, prefix="semflow-tp-overlap-")
    out = [None] * 10

    def one(i):
        try:
            c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=120)
            c.request("POST", "/v1/completions", body=json.dumps(body(i)), headers={"Content-Type": "application/json"})
            r = c.getresponse()
            d = json.loads(r.read())
            c.close()
            ch = d["choices"][0]
            out[i] = (r.status, ch["text"], ch["finish_reason"], d["usage"]["completion_tokens"])
        except Exception as e:  # noqa: BLE001 - reported as a mismatch below
            out[i] = ("error", str(e))

    try:
        ts = [threading.Thread(target=one, args=(i,)) for i in range(10)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    finally:
        srv.stop()
    return out


def main():
    if not os.path.exists(MODEL):
        check("tp_overlap_equals_serial", False, "test data missing: %s" % MODEL)
        return
    serial = run(False)
    over = run(True)
    bad = [(i, serial[i], over[i]) for i in range(10) if serial[i] != over[i] or serial[i][0] != 200]
    check("tp_overlap_equals_serial", not bad, "requests differ (index, serial, overlapped): %r" % bad[:3])
    reasons = {s[2] for s in serial if s[0] == 200}
    check("tp_overlap_mix", "stop" in reasons and "length" in reasons, "finish reasons seen: %r" % reasons)


if __name__ == "__main__":
    main()
    print("%d passed, %d failed" % (results.passed, results.failures))
    sys.exit(1 if results.failures else 0)
