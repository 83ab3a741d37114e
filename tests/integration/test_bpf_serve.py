#!/usr/bin/env python3
"""The eBPF parts inside `semflow serve` (demo model, CPU backend), seen from outside: /metrics
carries the monitor's counters with the server's own socket bytes growing as requests flow,
/dashboard serves the page, /dashboard/events streams snapshots with the server's stats, and
with tenant client prefixes the listener group gets the steering program. Needs root (CI is)."""
import http.client
import json
import os
import re
import socket
import subprocess
import tempfile
import time

BIN = os.environ.get("SEMFLOW_BIN", "build/semflow")
failures = 0


def check(name, cond, detail=""):
    global failures
    print(("PASS: %s" % name) if cond else ("FAIL: %s: %s" % (name, detail)), flush=True)
    failures += 0 if cond else 1


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def get(port, path, timeout=30, source=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout, source_address=source)
    c.request("GET", path)
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, r.getheader("Content-Type") or "", data


def metric(text, name, labels):
    for line in text.splitlines():
        if line.startswith(name + "{") and all(l in line for l in labels):
            return float(line.rsplit(" ", 1)[1])
    return None


def main():
    tenants = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
    json.dump({"tenants": [
        {"name": "rt", "api_keys": ["sk-rt-test-key"], "default_intent": "realtime-chat; urgency=high",
         "client_prefixes": ["127.0.0.2/32"]},
        {"name": "bulk", "api_keys": ["sk-bulk-test-key"], "default_intent": "batch; urgency=low",
         "client_prefixes": ["127.0.0.3/32"]}]}, tenants)
    tenants.close()
    log = tempfile.NamedTemporaryFile(prefix="semflow-bpf-serve-", suffix=".log", delete=False)
    port = free_port()
    proc = subprocess.Popen([BIN, "serve", "--model", "demo", "--host", "127.0.0.1", "--port", str(port),
                             "--workers", "2", "--tenants", tenants.name], stdout=log, stderr=log)
    try:
        deadline, up = time.time() + 120, False
        while time.time() < deadline and proc.poll() is None:
            try:
                up = get(port, "/health", timeout=2)[0] == 200
            except OSError:
                pass
            if up:
                break
            time.sleep(0.1)
        with open(log.name, errors="replace") as f:
            logtext = f.read()
        if not up:
            check("serve_starts", False, logtext[-2000:])
            return
        check("serve_monitor_on", "eBPF monitor off" not in logtext, logtext[-500:])
        check("serve_steering_on", "connection steering on" in logtext, logtext[-800:])

        st, _, m1 = get(port, "/metrics")
        m1 = m1.decode()
        check("metrics_bpf_up", st == 200 and "semflow_bpf_up 1" in m1, m1[:300])
        pid = str(proc.pid)
        tx1 = metric(m1, "semflow_socket_bytes_total", ['pid="%s"' % pid, 'dir="tx"']) or 0
        for _ in range(20):
            get(port, "/v1/models")
        time.sleep(0.5)  # a few snapshots
        m2 = get(port, "/metrics")[2].decode()
        tx2 = metric(m2, "semflow_socket_bytes_total", ['pid="%s"' % pid, 'dir="tx"'])
        check("metrics_server_socket_bytes_grow", tx2 is not None and tx2 >= tx1 + len(m1),
              "server tx %s -> %s" % (tx1, tx2))
        check("metrics_contention_index", re.search(r'semflow_pcie_contention_index\{gpu="0",link="(measured|nominal)"\}', m2)
              is not None, "missing in /metrics")

        # the DMA tuner's counters: swap bytes per lane, held-back swap-ins, the index it sees
        check("metrics_dma_tuner",
              all(metric(m2, "semflow_dma_swap_bytes_total", ['urgency="%s"' % u]) is not None
                  for u in ("low", "normal", "high"))
              and re.search(r"^semflow_dma_deferred_total \d+$", m2, re.M) is not None
              and re.search(r"^semflow_dma_contention_index [0-9.]+$", m2, re.M) is not None,
              "\n".join(l for l in m2.splitlines() if "dma" in l)[:600])

        st, ctype, page = get(port, "/dashboard")
        check("dashboard_page", st == 200 and "text/html" in ctype and b"/dashboard/events" in page,
              "%d %s" % (st, ctype))

        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(b"GET /dashboard/events HTTP/1.1\r\nHost: x\r\n\r\n")
        buf, end = b"", time.time() + 3
        while time.time() < end and buf.count(b"data: {") < 2:
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                break
            if not chunk:
                break
            buf += chunk
        s.close()
        events = [json.loads(l[6:]) for l in buf.decode(errors="replace").split("\n") if l.startswith("data: {")]
        ok = len(events) >= 2 and events[-1].get("monitor") and events[-1]["monitor"]["bpf"] and "server" in events[-1]
        check("dashboard_events", ok, buf[:400])
        srv = events[-1].get("server", {}) if events else {}
        check("dashboard_dma_and_decisions", all(k in srv for k in ("swaps_out", "dma_deferred", "pcie_contention"))
              and isinstance(srv.get("decisions"), dict) and "preempt_swap" in srv["decisions"], str(srv)[:400])

        # tenants on their prefixes are served through the steered group
        for src in ("127.0.0.2", "127.0.0.3"):
            st = get(port, "/health", source=(src, 0))[0]
            check("steered_client_%s_served" % src, st == 200, "status %d" % st)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            proc.kill()
        os.unlink(tenants.name)
        os.unlink(log.name)


def bad_flag():
    r = subprocess.run([BIN, "serve", "--model", "demo", "--dma-tuner", "sometimes"], capture_output=True, text=True,
                       timeout=30)
    check("serve_rejects_bad_dma_tuner", r.returncode == 2 and "--dma-tuner must be 'on' or 'off'" in r.stderr,
          "rc %d: %s" % (r.returncode, r.stderr[-300:]))


if __name__ == "__main__":
    bad_flag()
    main()
