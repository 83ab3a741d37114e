#!/usr/bin/env python3
"""Summarise a `semflow serve --sched-trace` file per load run of bench/overload/run.sh.

    python3 bench/overload/trace_summary.py OUTDIR [--json FILE]

Reads OUTDIR/trace.tsv (one line per engine step) and, for every OUTDIR/<run>.metrics.json that
watch.py wrote with the engine's step numbers at the start and end of the run (steps_range),
the trace lines of that run. Per run: steps, steps carrying realtime (high-urgency) tokens and
their time (P50 / P95 / max ms), steps planned for a realtime prompt with lower-class prefill
held out ("alone": cap_low 0) and the other steps with prefill (their time), preemptions planned in those steps, KV blocks swapped before
them and the longest swap time, the KV demand peak and the longest stretch above the degrade
threshold (0.92; dips under 0.5 s bridged, as the policy does), degrade transitions, and the most sequences running with INT8 KV.
"""
import glob
import json
import os
import sys

THRESHOLD = 0.92
BRIDGE_S = 0.5  # engine/sched_policy.c: DIP_BRIDGE_S


def pct(xs, q):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def load_trace(path):
    with open(path) as f:
        head = f.readline().rstrip("\n").split("\t")
        rows = []
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) != len(head):
                continue
            try:
                rows.append({k: float(v) for k, v in zip(head, parts)})
            except ValueError:
                continue
    return head, rows


def summarise(rows, prev_preempt):
    rt = [r for r in rows if r.get("rt_tokens", 0) > 0]
    out = {"steps": len(rows), "rt_steps": len(rt)}
    out["rt_step_ms_p50"] = pct([r["step_ms"] for r in rt], 0.5)
    out["rt_step_ms_p95"] = pct([r["step_ms"] for r in rt], 0.95)
    out["rt_step_ms_max"] = max([r["step_ms"] for r in rt], default=float("nan"))
    # steps planned for a realtime prompt with lower-class prefill held out (cap_low 0: the rule of
    # docs/SCHEDULER.md, "Realtime prompts first, alone"), and the other steps with prefill
    rtp = [r["step_ms"] for r in rows if r.get("cap_low", -1) == 0]
    oth = [r["step_ms"] for r in rows if r.get("cap_low", -1) != 0 and r["prefill"] > 0]
    out["rt_alone_steps"] = len(rtp)
    out["rt_alone_ms_p50"], out["rt_alone_ms_p95"] = pct(rtp, 0.5), pct(rtp, 0.95)
    out["other_prefill_ms_p50"], out["other_prefill_ms_p95"] = pct(oth, 0.5), pct(oth, 0.95)
    pre_rt = pre_all = 0
    last = prev_preempt
    for r in rows:
        d = r["preemptions"] - last if last is not None else 0
        last = r["preemptions"]
        pre_all += d
        if r.get("rt_tokens", 0) > 0:
            pre_rt += d
    out["preemptions"] = int(pre_all)
    out["preemptions_in_rt_steps"] = int(pre_rt)
    out["swap_blocks_in_rt_steps"] = int(sum(r.get("swap_blocks", 0) for r in rt))
    out["swap_ms_max_in_rt_steps"] = max([r.get("swap_ms", 0) for r in rt], default=0.0)
    dem = [r.get("kv_demand", 0) for r in rows]
    out["kv_demand_peak"] = max(dem, default=0.0)
    longest = 0.0
    since = dip = None
    for r in rows:  # as the policy watches it: dips back under shorter than BRIDGE_S are bridged
        if r.get("kv_demand", 0) > THRESHOLD:
            since = r["t_s"] if since is None else since
            dip = None
            longest = max(longest, r["t_s"] - since)
        elif since is not None:
            dip = r["t_s"] if dip is None else dip
            if r["t_s"] - dip > BRIDGE_S:
                since = dip = None
    out["kv_demand_above_s"] = longest
    trans = 0
    for a, b in zip(rows, rows[1:]):
        trans += a["degraded"] != b["degraded"]
    out["degrade_transitions"] = trans
    out["degraded_steps"] = sum(1 for r in rows if r["degraded"])
    out["running_i8_max"] = int(max([r.get("running_i8", 0) for r in rows], default=0))
    out["steps_with_i8"] = sum(1 for r in rows if r.get("running_i8", 0) > 0)
    return out


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: trace_summary.py OUTDIR [--json FILE]")
    d = sys.argv[1]
    tpath = os.path.join(d, "trace.tsv")
    try:
        head, rows = load_trace(tpath)
    except OSError as e:
        sys.exit("trace_summary: cannot read %s: %s (run.sh writes it with --sched-trace)" % (tpath, e))
    if "step" not in head:
        sys.exit("trace_summary: %s has no step column (a trace from an older binary)" % tpath)
    runs = {}
    for m in sorted(glob.glob(os.path.join(d, "*.metrics.json"))):
        name = os.path.basename(m)[:-len(".metrics.json")]
        try:
            w = json.load(open(m))
        except (OSError, ValueError):
            continue
        rng = w.get("steps_range")
        if not rng:
            continue
        lo, hi = rng
        sel = [r for r in rows if lo < r["step"] <= hi]
        before = [r for r in rows if r["step"] <= lo]
        runs[name] = summarise(sel, before[-1]["preemptions"] if before else None)
    order = sorted(runs, key=lambda n: (not n.startswith(("on", "off")), n.split("-")[-1].rjust(4), n))
    print("%-10s %6s %6s %16s %13s %10s %8s %8s %8s %8s %8s %6s %6s" % (
        "run", "steps", "rt", "rt ms p50/95/max", "alone n p50/95", "pf p50/95", "preempt", "pre@rt", "swap@rt",
        "swapms", "demand", ">92%s", "deg/i8"))
    for n in order:
        s = runs[n]
        print("%-10s %6d %6d %16s %13s %10s %8d %8d %8d %8.1f %7.1f%% %6.1f %6s" % (
            n, s["steps"], s["rt_steps"], "%.0f/%.0f/%.0f" % (s["rt_step_ms_p50"], s["rt_step_ms_p95"], s["rt_step_ms_max"]),
            "%d %.0f/%.0f" % (s["rt_alone_steps"], s["rt_alone_ms_p50"], s["rt_alone_ms_p95"]),
            "%.0f/%.0f" % (s["other_prefill_ms_p50"], s["other_prefill_ms_p95"]),
            s["preemptions"], s["preemptions_in_rt_steps"], s["swap_blocks_in_rt_steps"], s["swap_ms_max_in_rt_steps"],
            100 * s["kv_demand_peak"], s["kv_demand_above_s"], "%d/%d" % (s["degrade_transitions"], s["running_i8_max"])))
    if "--json" in sys.argv:
        with open(sys.argv[sys.argv.index("--json") + 1], "w") as f:
            json.dump(runs, f, indent=1)


if __name__ == "__main__":
    main()
