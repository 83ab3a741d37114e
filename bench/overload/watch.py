#!/usr/bin/env python3
"""Watch a semflow server's /metrics during one load run and summarise what the scheduler did.

    python3 bench/overload/watch.py URL OUT.json [--interval 0.5]

Samples URL/metrics every interval until SIGTERM or SIGINT, then writes OUT.json:
KV usage peak and mean, KV demand peak (what the degrade policy watches), the most sequences
running with INT8 KV, the engine's step numbers at start and end (to cut the step trace), whether the degraded state was seen, and the change over the run of
every scheduler counter (semflow_sched_decisions_total by decision, preemptions, swaps, steps,
prefill and decode tokens, the requests refused with 429).
"""
import json
import re
import signal
import sys
import time
import urllib.request

LINE = re.compile(r'^([a-z_][a-z_0-9]*)(\{[^}]*\})? ([0-9.eE+-]+|NaN|[+-]Inf)$')
COUNTERS = ("semflow_preemptions_total", "semflow_swaps_out_total", "semflow_engine_steps_total",
            "semflow_engine_prefill_tokens_total", "semflow_engine_decode_tokens_total",
            "semflow_engine_finished_total")


def scrape(url):
    """{name or name{labels}: value} from one /metrics page; None when the server did not answer."""
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=2) as r:
            text = r.read().decode()
    except OSError:
        return None
    out = {}
    for line in text.splitlines():
        m = LINE.match(line)
        if m:
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


def main():
    if len(sys.argv) < 3:
        sys.exit("usage: watch.py URL OUT.json [--interval S]")
    url, out = sys.argv[1].rstrip("/"), sys.argv[2]
    interval = float(sys.argv[sys.argv.index("--interval") + 1]) if "--interval" in sys.argv else 0.5
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    first = last = None
    kv, demand, i8 = [], [], []
    degraded = 0
    while not stop:
        s = scrape(url)
        if s is not None:
            first = first or s
            last = s
            kv.append(s.get("semflow_kv_usage_ratio", 0.0))
            demand.append(s.get("semflow_kv_demand_ratio", 0.0))
            i8.append(s.get("semflow_running_kv_int8", 0.0))
            degraded = max(degraded, int(s.get("semflow_sched_degraded", 0)))
        time.sleep(interval)
    s = scrape(url)  # the last word: counters after the run
    if s is not None:
        last = s
    res = {"samples": len(kv), "kv_usage_peak": max(kv) if kv else None,
           "kv_usage_mean": sum(kv) / len(kv) if kv else None, "degraded_seen": degraded,
           "kv_demand_peak": max(demand) if demand else None, "running_kv_int8_peak": max(i8) if i8 else None,
           "decisions": {}, "counters": {}}
    if first and last:
        for k, v in last.items():
            m = re.fullmatch(r'semflow_sched_decisions_total\{decision="([a-z_0-9]+)"\}', k)
            if m:
                res["decisions"][m.group(1)] = v - first.get(k, 0.0)
        for k in COUNTERS:
            res["counters"][k] = last.get(k, 0.0) - first.get(k, 0.0)
        # the engine's step numbers of the run: the --sched-trace lines of this run (column "step")
        res["steps_range"] = [first.get("semflow_engine_steps_total", 0.0), last.get("semflow_engine_steps_total", 0.0)]
        res["counters"]["rejected_429"] = sum(v - first.get(k, 0.0) for k, v in last.items()
                                              if k.startswith("semflow_rejected_total{"))
    with open(out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
