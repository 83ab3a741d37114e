#!/usr/bin/env python3
"""The scheduler policy seen from outside, against `semflow serve` on the demo model (CPU):
KV usage driven over the degrade threshold by real requests (relax, INT8 KV, preemption and
restore counted in /metrics), a min-throughput floor the engine cannot meet refused with 429
before any work, and bad policy flags refused with a clear message."""
import http.client
import json
import os
import re
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from sftest import ServerProcess, check, results, run  # noqa: E402

PROMPT = " ".join("word%d" % (i % 37) for i in range(100))


def post(port, body, intent, timeout=300):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request("POST", "/v1/completions", body=json.dumps(body),
              headers={"Content-Type": "application/json", "X-Semantic-Intent": intent})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, dict((k.lower(), v) for k, v in r.getheaders()), data


def metrics(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()
    out = {}
    for line in text.splitlines():
        m = re.match(r'^([a-z_]+(?:\{[^}]*\})?) ([0-9.eE+-]+)$', line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def decision(m, name):
    return m.get('semflow_sched_decisions_total{decision="%s"}' % name, -1)


def degrade_under_kv_pressure():
    # 40 blocks of 16 tokens; four low-urgency requests of ~100 + 200 tokens need twice that.
    srv = ServerProcess(["--model", "demo", "--threads", "1", "--workers", "1", "--bpf", "off",
                         "--num-kv-blocks", "40", "--kv-high-reserve", "0", "--swap-space", "0",
                         "--max-num-seqs", "4", "--max-batched-tokens", "64", "--kv-degrade-hold", "0",
                         "--kv-degrade-restore", "0.05"])
    try:
        m0 = metrics(srv.port)
        check("metrics_expose_every_decision",
              all(decision(m0, d) == 0 for d in ("relax", "kv_int8", "restore", "preempt_swap",
                                                 "preempt_recompute", "reject"))
              and m0.get("semflow_sched_degraded") == 0 and "semflow_kv_usage_ratio" in m0, str(m0)[:300])
        codes = []

        def one():
            st, _, _ = post(srv.port, {"prompt": PROMPT, "max_tokens": 200, "ignore_eos": True, "temperature": 0},
                            "batch-summarize; urgency=low; max-latency=300ms")
            codes.append(st)
        th = [threading.Thread(target=one) for _ in range(4)]
        for t in th:
            t.start()
        for t in th:
            t.join()
        check("degrade_requests_all_complete", codes == [200] * 4, str(codes))
        deadline = time.time() + 5
        m = metrics(srv.port)
        while m.get("semflow_sched_degraded", 1) != 0 and time.time() < deadline:
            time.sleep(0.05)
            m = metrics(srv.port)
        check("degrade_entered_under_kv_pressure", decision(m, "relax") >= 1 and decision(m, "kv_int8") >= 1,
              "relax %g kv_int8 %g" % (decision(m, "relax"), decision(m, "kv_int8")))
        check("degrade_preemptions_counted",
              decision(m, "preempt_recompute") >= 1 and decision(m, "preempt_recompute") == m.get(
                  "semflow_preemptions_total"), "recompute %g, preemptions %g" % (
                      decision(m, "preempt_recompute"), m.get("semflow_preemptions_total", -1)))
        check("degrade_restored_when_idle", decision(m, "restore") >= 1 and m.get("semflow_sched_degraded") == 0,
              "restore %g degraded %g" % (decision(m, "restore"), m.get("semflow_sched_degraded", -1)))
    finally:
        srv.proc.terminate()
        srv.proc.wait(timeout=30)
        srv._cleanup()


def floor_refused():
    srv = ServerProcess(["--model", "demo", "--threads", "1", "--workers", "1", "--bpf", "off"])
    try:
        done = []
        t = threading.Thread(target=lambda: done.append(post(srv.port, {"prompt": PROMPT, "max_tokens": 400,
                                                                        "ignore_eos": True},
                                                             "chat; urgency=normal")[0]))
        t.start()
        deadline = time.time() + 30
        # decoding for a few steps: the engine has measured what a step takes
        while (metrics(srv.port).get("semflow_engine_decode_tokens_total", 0) < 4 or
               metrics(srv.port).get("semflow_running_sequences", 0) < 1) and time.time() < deadline:
            time.sleep(0.02)
        # Steps take far longer than 1 ms, so a floor of 1000 tokens/s per request cannot be met.
        st, hdr, body = post(srv.port, {"prompt": "hello", "max_tokens": 4},
                             "batch-summarize; urgency=low; min-throughput=1000000tokens/sec")
        msg = json.loads(body).get("error", {}).get("message", "") if body else ""
        check("floor_that_cannot_be_met_gets_429", st == 429 and "retry-after" in hdr and "min-throughput" in msg,
              "%d %s %s" % (st, hdr.get("retry-after"), msg))
        check("floor_refusal_counted", decision(metrics(srv.port), "reject") >= 1)
        # without a floor the same request is served
        st2, _, _ = post(srv.port, {"prompt": "hello", "max_tokens": 4}, "batch-summarize; urgency=low")
        check("no_floor_is_served", st2 == 200, str(st2))
        t.join()
        check("running_request_unaffected", done == [200], str(done))
    finally:
        srv.proc.terminate()
        srv.proc.wait(timeout=30)
        srv._cleanup()


def bad_flags():
    rc, _, err = run("serve", "--model", "demo", "--bpf", "off", "--kv-degrade-threshold", "0.5", timeout=60)
    check("degrade_thresholds_inverted_refused", rc != 0 and "leave <= enter" in err, "%d %s" % (rc, err[-300:]))
    rc, _, err = run("serve", "--model", "demo", "--step-shaping", "maybe", timeout=60)
    check("step_shaping_bad_value_refused", rc == 2 and "'on' or 'off'" in err, "%d %s" % (rc, err[-300:]))
    rc, _, err = run("serve", "--model", "demo", "--kv-degrade-threshold", "1.5", timeout=60)
    check("degrade_threshold_out_of_range_refused", rc == 2 and "from 0 to 1" in err, "%d %s" % (rc, err[-300:]))


if __name__ == "__main__":
    degrade_under_kv_pressure()
    floor_refused()
    bad_flags()
    print("%d passed, %d failed" % (results.passed, results.failures))
    sys.exit(1 if results.failures else 0)
