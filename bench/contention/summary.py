"""summary.py OUTDIR TUNER... -- the contention experiment's table (bench/contention/run.sh).

For each run (tuner off / on): per class completed requests, TTFT and ITL median and P99 (ms),
the P99-P50 spread, and from the server's /metrics after the run: sequences swapped out, low-class
swap bytes, swap-ins the tuner held back and the contention index it last saw. Then the high
class's change from off to on. Runs whose files are missing are reported as such."""
import json
import os
import sys


def metric(out, t, name):
    """Sum of the samples of `name` (a metric name with or without labels) in t.metrics."""
    v, seen = 0.0, False
    try:
        with open(os.path.join(out, t + ".metrics")) as f:
            for line in f:
                if line.startswith(name) and not line.startswith("#"):
                    v += float(line.split()[-1])
                    seen = True
    except (OSError, ValueError):
        return None
    return v if seen else None


def fmt(v, f="%.0f"):
    return "n/a" if v is None else f % v


def main():
    out, tuners = sys.argv[1], sys.argv[2:]
    rows = {}
    print("%-4s %-16s %6s %6s %9s %9s %9s %9s %9s" % ("DMA", "class", "done", "failed", "TTFTp50", "TTFTp99",
                                                      "ITLp50", "ITLp99", "ITLspread"))
    for t in tuners:
        try:
            with open(os.path.join(out, t + ".json")) as f:
                r = json.load(f)
        except (OSError, ValueError) as e:
            print("%-4s (no report: %s)" % (t, e))
            continue
        for c in r["classes"]:
            rows[(t, c["class"])] = c
            print("%-4s %-16s %6d %6d %9.1f %9.1f %9.2f %9.2f %9.2f" % (
                t, c["class"], c["completed"], c.get("failed", 0), c["ttft"]["median_ms"], c["ttft"]["p99_ms"],
                c["itl"]["median_ms"], c["itl"]["p99_ms"], c["itl"]["p99_ms"] - c["itl"]["median_ms"]))
        low = metric(out, t, 'semflow_dma_swap_bytes_total{urgency="low"}')
        print("%-4s swaps out %s, low-class swap bytes %s MB, swap-ins held back %s, contention index seen %s" % (
            t, fmt(metric(out, t, "semflow_swaps_out_total")), fmt(low / 1e6 if low is not None else None),
            fmt(metric(out, t, "semflow_dma_deferred_total")),
            fmt(metric(out, t, "semflow_dma_contention_index"), "%.2f")))
    hi = "realtime-chat"
    if ("off", hi) in rows and ("on", hi) in rows:
        a, b = rows[("off", hi)], rows[("on", hi)]
        for k in ("ttft", "itl"):
            p_off, p_on = a[k]["p99_ms"], b[k]["p99_ms"]
            s_off, s_on = p_off - a[k]["median_ms"], p_on - b[k]["median_ms"]
            print("high class %s P99: off %.2f ms, on %.2f ms (%+.0f%%); P99-P50 spread off %.2f, on %.2f (%+.0f%%)" % (
                k.upper(), p_off, p_on, 100 * (p_on / p_off - 1) if p_off else 0, s_off, s_on,
                100 * (s_on / s_off - 1) if s_off else 0))


if __name__ == "__main__":
    main()
