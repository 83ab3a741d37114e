#!/usr/bin/env python3
"""A tensor-parallel rank dies while the engine serves (CPU ranks, `semflow serve
--tensor-parallel-size 2`): the requests of the step in flight end with an error that names the
rank (streamed: an error event, then [DONE]; not a hang, not a lost request), the server keeps
answering, and a new completion is refused with 503 and code engine_unavailable, saying why and
what to do."""
import http.client
import json
import os
import signal
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from sftest import DATA, ServerProcess, check, rank_pids, results  # noqa: E402

MODEL = os.path.join(DATA, "stories260K", "stories260K.gguf")
N = 3


def stream(port, out, i, started):
    body = {"model": "stories260K", "prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": True,
            "temperature": 0, "stream": True}
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        c.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        events, err, done = 0, None, False
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                break
            d = json.loads(line[6:])
            if "error" in d:
                err = d["error"]
            else:
                events += 1
                started.set()
        out[i] = {"status": r.status, "events": events, "error": err, "done": done}
        c.close()
    except Exception as e:  # noqa: BLE001 - reported below
        out[i] = {"exception": str(e)}
    started.set()


def main():
    if not os.path.exists(MODEL):
        check("tp_rank_dies", False, "test data missing: %s" % MODEL)
        return
    env = dict(os.environ, SEMFLOW_TP_TIMEOUT_MS="3000")
    srv = ServerProcess(["--model", MODEL, "--backend", "cpu", "--threads", "1", "--workers", "1", "--bpf", "off",
                         "--max-num-seqs", "4", "--max-batched-tokens", "64", "--tensor-parallel-size", "2"],
                        env=env, prefix="semflow-tp-dies-")
    out = [None] * N
    try:
        followers = rank_pids(srv.proc.pid)
        check("tp_follower_found", len(followers) == 1, "children of the server: %r" % followers)
        starts = [threading.Event() for _ in range(N)]
        ts = [threading.Thread(target=stream, args=(srv.port, out, i, starts[i])) for i in range(N)]
        for t in ts:
            t.start()
        for s in starts:
            s.wait(30)
        t0 = time.time()
        for pid in followers:
            os.kill(pid, signal.SIGKILL)
        for t in ts:
            t.join(40)
        took = time.time() - t0
        ok = all(o and o.get("status") == 200 and o.get("done") and o.get("error") and o["events"] < 400
                 and "rank" in o["error"].get("message", "") for o in out)
        check("tp_rank_dies_requests_end_with_error", ok and took < 30, "after %.1f s: %r" % (took, out))
        c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=20)
        c.request("POST", "/v1/completions", body=json.dumps({"model": "stories260K", "prompt": "Hi", "max_tokens": 4}),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        d = json.loads(r.read() or b"{}")
        c.close()
        e = d.get("error", {})
        check("tp_rank_dies_then_503", r.status == 503 and e.get("code") == "engine_unavailable"
              and "rank" in e.get("message", "") and "restart" in e.get("message", ""), "%d %r" % (r.status, d))
        check("tp_rank_dies_server_alive", srv.proc.poll() is None, "server exited: %s" % srv.logtext()[-500:])
    finally:
        srv.stop(30)


if __name__ == "__main__":
    main()
    print("%d passed, %d failed" % (results.passed, results.failures))
    sys.exit(1 if results.failures else 0)
