#!/usr/bin/env python3
"""The overload ladder's picture and table, from the loadgen JSON reports bench/overload/run.sh wrote.

    python3 bench/overload/plot.py OUTDIR [--png docs/overload-cpu.png] [--title TEXT] [--no-png]

Reads OUTDIR/sustained_rate, OUTDIR/{on,off}-<level>x.json (loadgen) and, when present,
OUTDIR/{on,off}-<level>x.metrics.json (watch.py). Writes the PNG (latency against load per class:
TTFT and ITL P95 solid, P99 dashed, priorities on against off) and OUTDIR/overload.md (a Markdown
table per class and level: TTFT/ITL P50/P95/P99, goodput, completed/429/failed, decode tokens/s per
admitted request, and per level the KV usage peak and the scheduler's decisions), and prints it.
"""
import argparse
import json
import os
import re
import sys


def load_runs(outdir):
    """{mode: {level: report}} for every on-/off-<level>x.json in outdir."""
    runs = {"on": {}, "off": {}}
    for name in os.listdir(outdir):
        m = re.fullmatch(r"(on|off)-(\d+)x\.json", name)
        if not m:
            continue
        path = os.path.join(outdir, name)
        try:
            with open(path) as f:
                runs[m.group(1)][int(m.group(2))] = json.load(f)
        except (OSError, ValueError) as e:
            sys.exit(f"plot.py: cannot read {path}: {e}; rerun bench/overload/run.sh")
    if not runs["on"] and not runs["off"]:
        sys.exit(f"plot.py: no on-<N>x.json / off-<N>x.json in {outdir}; run bench/overload/run.sh {outdir} first")
    return runs


def cls(report, name):
    for c in report["classes"]:
        if c["class"] == name:
            return c
    return None


def class_names(runs):
    names = []
    for mode in runs.values():
        for rep in mode.values():
            for c in rep["classes"]:
                if c["class"] not in names:
                    names.append(c["class"])
    return names


def load_watch(outdir, mode, level):
    try:
        with open(os.path.join(outdir, f"{mode}-{level}x.metrics.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def watch_table(outdir, runs):
    rows = ["| priorities | load | KV held peak | KV demand peak | degraded | relax | kv_int8 | INT8 seqs (max) | restore "
            "| preempt swap | preempt recompute | reject (429) | steps | mean step (ms) |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for mode in ("on", "off"):
        for level in sorted(runs[mode]):
            w = load_watch(outdir, mode, level)
            if not w or w.get("kv_usage_peak") is None:
                continue
            d, c = w["decisions"], w["counters"]
            steps = c.get("semflow_engine_steps_total", 0)
            dur = runs[mode][level]["duration_s"]
            dem, i8 = w.get("kv_demand_peak"), w.get("running_kv_int8_peak")
            rows.append("| %s | %dx | %.1f%% | %s | %s | %d | %d | %s | %d | %d | %d | %d | %d | %s |" % (
                mode, level, 100 * w["kv_usage_peak"], "%.1f%%" % (100 * dem) if dem is not None else "-",
                "yes" if w["degraded_seen"] else "no", d.get("relax", 0), d.get("kv_int8", 0),
                "%d" % i8 if i8 is not None else "-", d.get("restore", 0), d.get("preempt_swap", 0),
                d.get("preempt_recompute", 0), d.get("reject", 0), steps,
                "%.1f" % (1000.0 * dur / steps) if steps else "-"))
    return "\n".join(rows) + "\n" if len(rows) > 2 else ""


def short(outdir, runs, rate):
    """One line per run: what the goals of issue 6 look at."""
    rows = ["1x = %s req/s" % rate,
            "%-4s %-5s %9s %9s %9s %9s %10s %8s %8s %8s %4s %6s %6s" % (
                "prio", "load", "rtTTFT95", "rtITL95", "rt c/429", "bt c/429", "bt tok/s", "failed", "KVpeak",
                "demand", "deg", "relax", "int8")]
    for level in sorted(set(runs["on"]) | set(runs["off"])):
        for mode in ("on", "off"):
            rep = runs[mode].get(level)
            if not rep:
                continue
            rt, bt = cls(rep, "realtime-chat"), cls(rep, "batch-summarize")
            w = load_watch(outdir, mode, level) or {}
            d = w.get("decisions", {})
            f = (lambda c, k: "%.0f" % c[k]["p95_ms"] if c and c[k]["n"] else "-")
            tps = (lambda c: "%.1f" % (1000.0 / c["tpot"]["mean_ms"]) if c and c["tpot"]["n"] and
                   c["tpot"]["mean_ms"] > 0 else "-")
            cr = (lambda c: "%d/%d" % (c["completed"], c["rejected_429"]) if c else "-")
            kv, dem = w.get("kv_usage_peak"), w.get("kv_demand_peak")
            rows.append("%-4s %-5s %9s %9s %9s %9s %10s %8d %8s %8s %4s %6d %6d" % (
                mode, "%dx" % level, f(rt, "ttft"), f(rt, "itl"), cr(rt), cr(bt), tps(bt), rep["all"]["failed"],
                "%.1f%%" % (100 * kv) if kv is not None else "-", "%.1f%%" % (100 * dem) if dem is not None else "-",
                "yes" if w.get("degraded_seen") else "no", d.get("relax", 0), d.get("kv_int8", 0)))
    lo, hi = runs["on"].get(1), runs["on"].get(max(runs["on"], default=1))
    a, b = cls(lo, "realtime-chat") if lo else None, cls(hi, "realtime-chat") if hi else None
    if a and b and a["ttft"]["n"] and b["ttft"]["n"] and a["ttft"]["p95_ms"] > 0 and hi is not lo:
        rows.append("realtime TTFT P95 with priorities, 1x -> %dx: %.0f -> %.0f ms (%+.0f%%; goal <= +10%%)" % (
            max(runs["on"]), a["ttft"]["p95_ms"], b["ttft"]["p95_ms"],
            100.0 * (b["ttft"]["p95_ms"] / a["ttft"]["p95_ms"] - 1)))
    return "\n".join(rows) + "\n"


def table(runs, rate):
    rows = ["| class | priorities | load | req/s | TTFT P50 / P95 / P99 (ms) | ITL P50 / P95 / P99 (ms) "
            "| goodput (req/s) | completed / 429 / failed | tok/s per request |",
            "|---|---|---|---|---|---|---|---|---|"]
    for name in class_names(runs):
        for mode in ("on", "off"):
            for level in sorted(runs[mode]):
                rep = runs[mode][level]
                c = cls(rep, name)
                if c is None:
                    continue
                t, i = c["ttft"], c["itl"]
                tps = 1000.0 / c["tpot"]["mean_ms"] if c["tpot"]["n"] and c["tpot"]["mean_ms"] > 0 else 0.0
                lat = (lambda s: "%.0f / %.0f / %.0f" % (s["median_ms"], s.get("p95_ms", s["p90_ms"]), s["p99_ms"])
                       if s["n"] else "-")
                rows.append("| %s | %s | %dx | %g | %s | %s | %.2f | %d / %d / %d | %.1f |" % (
                    name, mode, level, rep["request_rate"], lat(t), lat(i), c["goodput"], c["completed"],
                    c["rejected_429"], c["failed"], tps))
    head = "Sustained rate (1x): %s req/s; SLO for goodput: TTFT <= %g ms, TPOT <= %g ms.\n\n" % (
        rate, next(iter(next(r for r in runs.values() if r).values()))["slo"]["ttft_ms"],
        next(iter(next(r for r in runs.values() if r).values()))["slo"]["tpot_ms"])
    return head + "\n".join(rows) + "\n"


def plot(runs, rate, png, title):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        # Debian's python3-matplotlib belongs to /usr/bin/python3; another python3 earlier in PATH
        # (pyenv, a venv) does not see it, so run again with Debian's interpreter.
        debian = "/usr/bin/python3"
        if os.path.realpath(sys.executable) != os.path.realpath(debian) and os.access(debian, os.X_OK):
            os.execv(debian, [debian] + sys.argv)
        sys.exit("plot.py: matplotlib is missing; install it: apt-get install python3-matplotlib (tools/deps.sh)")
    names = class_names(runs)
    fig, axes = plt.subplots(2, len(names), figsize=(6 * len(names), 8), squeeze=False)
    colors = {"on": "tab:blue", "off": "tab:orange"}
    for col, name in enumerate(names):
        for row, (metric, label) in enumerate((("ttft", "TTFT"), ("itl", "ITL"))):
            ax = axes[row][col]
            for mode in ("on", "off"):
                levels = [lv for lv in sorted(runs[mode]) if cls(runs[mode][lv], name) and
                          cls(runs[mode][lv], name)[metric]["n"]]
                if not levels:
                    continue
                p95 = [cls(runs[mode][lv], name)[metric].get("p95_ms", 0) for lv in levels]
                p99 = [cls(runs[mode][lv], name)[metric]["p99_ms"] for lv in levels]
                ax.plot(levels, p95, "o-", color=colors[mode], label=f"priorities {mode}, P95")
                ax.plot(levels, p99, "s--", color=colors[mode], alpha=0.7, label=f"priorities {mode}, P99")
            if metric == "ttft" and name.startswith("realtime"):
                ax.axhline(400, color="gray", linestyle=":", label="max-latency 400 ms")
                ax.axhline(300, color="green", linestyle=":", label="goal: P95 < 300 ms")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xticks([1, 2, 4, 8])
            ax.set_xticklabels(["1x", "2x", "4x", "8x"])
            ax.set_xlabel(f"offered load (1x = {rate} req/s, Poisson)")
            ax.set_ylabel(f"{label} (ms, log)")
            ax.set_title(f"{name}: {label}")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    os.makedirs(os.path.dirname(png) or ".", exist_ok=True)
    fig.savefig(png, dpi=90)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir")
    ap.add_argument("--png", default="docs/overload-cpu.png")
    ap.add_argument("--title", default="semflow mixed-priority overload: latency against load")
    ap.add_argument("--no-png", action="store_true", help="only the table (no matplotlib needed)")
    ap.add_argument("--short", action="store_true", help="print one line per run instead of the tables")
    a = ap.parse_args()
    if not os.path.isdir(a.outdir):
        sys.exit(f"plot.py: {a.outdir} is not a folder; give the OUTDIR bench/overload/run.sh wrote")
    try:
        with open(os.path.join(a.outdir, "sustained_rate")) as f:
            rate = f.read().strip()
    except OSError:
        rate = "?"
    runs = load_runs(a.outdir)
    md = table(runs, rate)
    w = watch_table(a.outdir, runs)
    if w:
        md += "\nScheduler during each run (/metrics, sampled every 0.5 s):\n\n" + w
    if not a.no_png:
        plot(runs, rate, a.png, a.title)  # first: it may run this script again under Debian's python3
    with open(os.path.join(a.outdir, "overload.md"), "w") as f:
        f.write(md)
    print(short(a.outdir, runs, rate) if a.short else md)
    print(f"wrote {'' if a.no_png else a.png + ' and '}{os.path.join(a.outdir, 'overload.md')}")


if __name__ == "__main__":
    main()
