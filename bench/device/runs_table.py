#!/usr/bin/env python3
"""bench/device/runs_table.py DIR NAME... -- the table a device script prints last: one line
per `semflow bench --json` run, read from DIR/NAME.json, or the last line of DIR/NAME.err for a
run that failed. decode: ms a token, tokens/s, roofline, ratio, host us a step; decode-batch:
ms a step and tokens/s; prefill: ms, tokens/s and MFU."""
import json
import os
import sys


def line(d, name):
    try:
        j = json.load(open(os.path.join(d, name + ".json")))
    except Exception as e:
        try:
            err = open(os.path.join(d, name + ".err")).read().strip().splitlines()
        except OSError:
            err = ["not run"]
        return "%-16s failed: %s" % (name, err[-1] if err else e)
    mode = j.get("mode")
    if mode == "decode-batch":
        return "%-16s %10.3f ms a step of %d, %8.1f tokens/s (batch 1: %.3f ms)" % (
            name, j["ms_per_step_median"], j["batch"], j["tokens_per_s"], j["batch1_ms_per_step"])
    if mode == "prefill":
        return "%-16s %10.3f ms, %8.1f tokens/s, MFU %.1f%%" % (name, j["ms_median"], j["tokens_per_s"], 100 * j["mfu"])
    return "%-16s %10.3f %10.1f %8.3fms %7.1f%% %7.1fus" % (
        name, j["ms_per_token_median"], j["tokens_per_s"], j.get("roofline_ms", 0), 100 * j["ratio"],
        j.get("host_us_per_step", 0))


def main():
    d = sys.argv[1]
    print("%-16s %10s %10s %10s %8s %9s" % ("run", "ms", "tokens/s", "roofline", "ratio", "host"))
    for name in sys.argv[2:]:
        print(line(d, name))


if __name__ == "__main__":
    main()
