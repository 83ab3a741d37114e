#!/usr/bin/env python3
"""semflow loadgen against a scripted SSE server: a 200 stream that carries an error event and
finish_reason "error" (what semflow sends when the engine fails a request) counts as failed,
not completed; a stream whose tokens carry no text has its TTFT at the end, never 0;
--prefix-tokens begins every prompt with the same words (a system message with --chat) and the
report sums the usage's cached tokens; bad flags and a scenario's bad prefix_tokens exit 2 naming
what is wrong, before any request."""
import http.server
import json
import os
import subprocess
import sys
import tempfile
import threading

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from sftest import BIN, check, results  # noqa: E402

MODE = {"kind": "error"}
BODIES = []


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"  # the body ends when the connection closes

    def log_message(self, *a):
        pass

    def do_POST(self):
        BODIES.append(json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0)))))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()

        def ev(o):
            self.wfile.write(b"data: " + json.dumps(o).encode() + b"\n\n")
            self.wfile.flush()
        if MODE["kind"] == "error":
            ev({"choices": [{"index": 0, "text": "hello", "finish_reason": None}]})
            ev({"choices": [{"index": 0, "text": "", "finish_reason": "error"}]})
            ev({"error": {"message": "forward step failed", "type": "server_error"}})
        else:
            for _ in range(3):
                ev({"choices": [{"index": 0, "text": "", "finish_reason": None}]})
            ev({"choices": [{"index": 0, "text": "", "finish_reason": "length"}],
                "usage": {"prompt_tokens": 40, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 32}}})
        self.wfile.write(b"data: [DONE]\n\n")


def loadgen(port, out, *extra):
    p = subprocess.run([BIN, "loadgen", "--url", "http://127.0.0.1:%d" % port, "--concurrency", "1",
                        "--num-requests", "3", "--timeout", "20", "--json", out] + list(extra), capture_output=True,
                       timeout=60)
    with open(out) as f:
        return p.returncode, json.load(f)["all"]


def bad_inputs(d):
    for args, what in [(["--prefix-tokens", "abc"], "--prefix-tokens"), (["--prefix-tokens", "-3"], "--prefix-tokens"),
                       (["--prefix-tokens", "100001"], "--prefix-tokens"), (["--concurrency", "0"], "--concurrency"),
                       (["--prompt-tokens", "uniform:9"], "")]:
        p = subprocess.run([BIN, "loadgen", "--url", "http://127.0.0.1:1"] + args, capture_output=True, text=True,
                           timeout=30)
        check("loadgen_bad_flag_%s" % "_".join(a.strip("-") for a in args), p.returncode == 2 and what in p.stderr and
              not BODIES, (p.returncode, p.stderr[-200:]))
    for i, val in enumerate(['"x"', "-1", "1.5", "200000"]):
        path = os.path.join(d, "bad%d.json" % i)
        with open(path, "w") as f:
            f.write('{"classes": [{"name": "a", "prefix_tokens": %s}]}' % val)
        p = subprocess.run([BIN, "loadgen", "--url", "http://127.0.0.1:1", "--scenario", path], capture_output=True,
                           text=True, timeout=30)
        check("loadgen_bad_scenario_prefix_tokens_%d" % i, p.returncode == 2 and "prefix_tokens" in p.stderr,
              (val, p.returncode, p.stderr[-200:]))


def main():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    port = srv.server_address[1]
    with tempfile.TemporaryDirectory() as d:
        try:
            bad_inputs(d)
            MODE["kind"] = "error"
            rc, a = loadgen(port, os.path.join(d, "err.json"))
            check("loadgen_error_stream_counts_failed", a["failed"] == 3 and a["completed"] == 0,
                  "completed %d failed %d" % (a["completed"], a["failed"]))
            check("loadgen_nothing_completed_exits_nonzero", rc != 0, str(rc))
            MODE["kind"] = "empty"
            rc, a = loadgen(port, os.path.join(d, "empty.json"))
            check("loadgen_textless_stream_ttft_not_zero",
                  a["completed"] == 3 and a["ttft"]["median_ms"] > 0 and
                  abs(a["ttft"]["median_ms"] - a["e2el"]["median_ms"]) < 1e-6,
                  "completed %d ttft %s e2el %s" % (a["completed"], a["ttft"]["median_ms"], a["e2el"]["median_ms"]))
            check("loadgen_cached_tokens_summed", a["cached_tokens"] == 96 and a["input_tokens"] == 120, a)
            del BODIES[:]
            loadgen(port, os.path.join(d, "pre.json"), "--prefix-tokens", "30", "--prompt-tokens", "5")
            prompts = [b["prompt"].split() for b in BODIES]
            check("loadgen_prefix_shared", len(prompts) == 3 and all(len(w) == 35 for w in prompts) and
                  prompts[0][:30] == prompts[1][:30] == prompts[2][:30] and prompts[0][30:] != prompts[1][30:], prompts)
            del BODIES[:]
            loadgen(port, os.path.join(d, "chat.json"), "--prefix-tokens", "30", "--prompt-tokens", "5", "--chat")
            ms = [b["messages"] for b in BODIES]
            check("loadgen_prefix_chat_system", len(ms) == 3 and all(m[0]["role"] == "system" and
                  len(m[0]["content"].split()) == 30 and m[0]["content"] == ms[0][0]["content"] and
                  len(m[1]["content"].split()) == 5 for m in ms), ms)
        finally:
            srv.shutdown()
    print("%d passed, %d failed" % (results.passed, results.failures))
    sys.exit(1 if results.failures else 0)


if __name__ == "__main__":
    main()
