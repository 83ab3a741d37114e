#!/usr/bin/env python3
"""bench/device/b1trace.py, the reader of the decode kernel timeline (SEMFLOW_CUDA_TRACE), on a
timeline written in b1trace.cu's format whose answers are known: three steps of four decoder
layers, every kernel's blocks at set times, and the split combine's second records (tag 65).
The device writes such files only on a GPU; the arithmetic that reads them runs anywhere."""
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from sftest import check, results  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
TOOL = os.path.join(ROOT, "bench", "device", "b1trace.py")

# gemv_ring.cuh's FG_* bits over SF_TR_GEMV (16); attention 64, its combine 65
QKV, GU, ADD, ATTN, COMBINE = 16 + 1 + 8, 16 + 1 + 2, 16 + 4, 64, 65
NS, CTX, HKV = 4, 4096, 2


def layer(recs, b):
    """One layer starting at b (ns); returns its end (the down projection's last block)."""
    for i, end in enumerate((9000, 9500, 9800, 10000)):  # QKV: 4 blocks, the last ends at b + 10 us
        t0 = b + 100 * i
        recs.append((QKV, 6144, 4096, 4, i, i, t0, 1000, 2000, b + end - t0))
    last = b + 12700  # attention: 8 blocks store their pieces 12.0 .. 12.7 us after b
    for i in range(NS * HKV):
        t0 = b + 9000 + 50 * i
        ready = b + 12000 + 100 * i
        end = ready + 50
        if i >= 6:  # the two combining blocks (one per kv head): count back +0.5 / +0.8 us after the
            cnt = last + (500 if i == 6 else 800)  # last piece, m and l 0.7 later, outputs 1.15 later
            ml, st = cnt + 700, cnt + 700 + 1150
            end = st + (550 if i == 7 else 0)  # the kernel's last block ends 3.2 us after the last piece
            recs.append((COMBINE, NS, CTX, NS * HKV, i, 10 + i, t0, cnt - t0, ml - t0, st - t0))
        recs.append((ATTN, NS, CTX, NS * HKV, i, 10 + i, t0, 1500, ready - t0, end - t0))
    a_end = last + 3200
    for kind, m, k, dur in ((ADD, 4096, 4096, 6000), (GU, 28672, 4096, 57000), (ADD, 4096, 14336, 26000)):
        for i in range(4):
            t0 = a_end - 1000 + 100 * i
            recs.append((kind, m, k, 4, i, i, t0, 500, 800, a_end + dur - (300 - 100 * i) - t0))
        a_end += dur
    return a_end


def run_tool(text, *args):
    """b1trace.py over a file holding text."""
    with tempfile.NamedTemporaryFile("w", suffix=".tr", delete=False) as f:
        f.write(text)
        path = f.name
    try:
        return subprocess.run([sys.executable, TOOL, path, *args], capture_output=True, text=True, timeout=60)
    finally:
        os.unlink(path)


def lines_of(recs):
    return "".join("%d %d %d %d %d %d %d %d %d %d\n" % r for r in recs)


def main():
    recs, t = [], 1_000_000
    for _ in range(3):
        for _ in range(4):
            t = layer(recs, t)
        t += 250_000  # the step's edge: lm_head, draw, embedding
    p = run_tool("# tag m k grid block sm t0 d_wait d_ready d_end (ns); %d records appended, %d kept\n"
                 % (len(recs), len(recs)) + lines_of(recs), "4250")
    out = p.stdout
    check("runs", p.returncode == 0 and "b1trace:" in out, "rc %d out %r err %r" % (p.returncode, out, p.stderr))
    lines = {ln.split()[0]: ln.split() for ln in out.splitlines() if ln.split()}
    # a layer: 10.0 QKV + 5.9 attention + 6.0 O + 57.0 gate/up + 26.0 down, after the down before
    check("layer_time", "layer: 104.90 us" in out, out)
    attn = lines.get("attn", [])
    check("attention_row", attn[1:3] == ["8", "8"] and attn[8:9] == ["2.70"] and attn[10:11] == ["5.90"],
          "attn row %r" % attn)
    want = ("8 combining blocks" not in out and "2 combining blocks" in out, "median piece -0.30",
            "count back first 0.50 / last 0.80", "then m and l 0.70", "then the outputs 1.15",
            "last outputs stored 2.65", "kernel's last block ends 3.20")
    line = next((ln for ln in out.splitlines() if ln.startswith("attention's split combine")), "")
    check("combine_breakdown", want[0] and all(w in line for w in want[1:]), "line %r" % line)
    check("step_edge", "step edge: " in out and "(median of 2)" in out, out)
    # a step of several rows: an attention launch's blocks carry their own token's keys (4096 and
    # 4097 here), and the O projection's four blocks ran two on one SM (the sms column says 3)
    batch = [(r[0], r[1], r[2] + (r[4] % 2) if r[0] in (ATTN, COMBINE) else r[2]) + r[3:5] +
             ((r[4] // 2 if r[4] < 2 else r[4] - 1,) if r[0] == ADD and r[2] == 4096 else r[5:6]) + r[6:]
             for r in recs]
    p = run_tool(lines_of(batch), "4250")
    rows = {ln.split()[0]: ln.split() for ln in p.stdout.splitlines() if ln.split()}
    check("several_rows", p.returncode == 0 and "layer: 104.90 us" in p.stdout and rows.get("attn", [])[1:3] ==
          ["8", "8"] and rows.get("O", [])[1:3] == ["4", "3"] and rows.get("qkv", [])[1:3] == ["4", "4"],
          p.stdout + p.stderr)
    # a timeline without combine records (the cluster combine at 512 keys) prints no breakdown
    p = run_tool(lines_of(r for r in recs if r[0] != COMBINE))
    check("no_combine_records", p.returncode == 0 and "layer: 104.90 us" in p.stdout and
          "split combine" not in p.stdout, p.stdout + p.stderr)
    # a file that is not a timeline: one clear line naming the bad line, exit 1
    p = run_tool("# header\n" + lines_of(recs[:1]) + "25 6144 4096 x 0 0 1 2 3 4\n")
    check("malformed_line", p.returncode == 1 and "line 3 is not a record" in p.stdout and not p.stderr,
          "rc %d out %r err %r" % (p.returncode, p.stdout, p.stderr))
    p = subprocess.run([sys.executable, TOOL, "/nonexistent/trace.tr"], capture_output=True, text=True, timeout=60)
    check("missing_file", p.returncode == 1 and "cannot read /nonexistent/trace.tr" in p.stdout and not p.stderr,
          "rc %d out %r err %r" % (p.returncode, p.stdout, p.stderr))
    return 1 if results.failures else 0


if __name__ == "__main__":
    sys.exit(main())
