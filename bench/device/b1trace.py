#!/usr/bin/env python3
"""b1trace.py — reads a decode step's kernel timeline (SEMFLOW_CUDA_TRACE=FILE, kernels/cuda/b1trace.cuh)
and prints, per kernel of a decoder layer, when its blocks started, got past the programmatic
wait, finished their prologue and ended, relative to the end of the kernel before it (medians
over the layers of the newest whole steps; µs). Usage: b1trace.py FILE [HBM_GB_S]"""
import statistics
import sys

GEMV, ATTN, SAMPLE, EMBED = 16, 64, 80, 81
COMBINE = 65  # an attention block that combined the split (b1trace.cuh tr_combine)
FG_NORM, FG_GLU, FG_ADD, FG_ROPE = 1, 2, 4, 8
HEAD_ROWS = 32768  # a norm GEMV of more rows is an lm_head (gemv_stream.cu)


def kind(tag, m, k):
    if tag == ATTN:
        return "attn"
    if tag == SAMPLE:
        return "put" if k == 0 else "draw"  # put: the id the greedy lm_head found (sample.cu)
    if tag == EMBED:
        return "embed"
    mode = tag - GEMV
    if mode == FG_NORM and m > HEAD_ROWS:
        return "lm_head"
    if mode & FG_ROPE or mode == FG_NORM:
        return "qkv"
    if mode & FG_GLU:
        return "gate/up"
    if mode & FG_ADD or mode == 0:  # residual add, or plain (the other TP ranks)
        return "O" if k <= m else "down"
    return "tag%d" % tag


def main():
    path = sys.argv[1]
    bw = float(sys.argv[2]) if len(sys.argv) > 2 else 4250.0
    groups, combines = {}, []
    try:
        f = open(path)
    except OSError as e:
        print("b1trace: cannot read %s: %s (SEMFLOW_CUDA_TRACE=FILE writes it when the backend closes)"
              % (path, e.strerror))
        return 1
    with f:
        for n, line in enumerate(f, 1):
            if line.startswith("#") or not line.strip():
                continue
            try:
                v = [int(x) for x in line.split()]
            except ValueError:
                v = []
            if len(v) != 10:
                print("b1trace: %s line %d is not a record (10 integers: tag m k grid block sm t0 d_wait d_ready"
                      " d_end, as SEMFLOW_CUDA_TRACE writes them): %r" % (path, n, line.strip()[:80]))
                return 1
            tag, m, k, grid, blk, sm, t0, dw, dr, de = v
            if tag == COMBINE:  # count back, m and l in, outputs stored (ns after t0)
                combines.append((t0 + dw, t0 + dr, t0 + de, t0))
                continue
            if tag == ATTN:  # a block's keys are its token's: one launch of a step of several rows has many
                m = k = 0
            groups.setdefault((tag, m, k, grid), []).append((t0, dw, dr, de, sm))
    inst = []
    for (tag, m, k, grid), recs in groups.items():
        recs.sort()
        n = len(recs) // grid * grid
        recs = recs[len(recs) - n:]  # the oldest launch may have been overwritten in part
        for i in range(0, n, grid):
            r = recs[i:i + grid]
            inst.append({
                "kind": kind(tag, m, k), "m": m, "k": k, "grid": grid,
                "start": min(x[0] for x in r), "last_start": max(x[0] for x in r),
                "wait0": min(x[0] + x[1] for x in r), "wait1": max(x[0] + x[1] for x in r),
                "ready1": max(x[0] + x[2] for x in r),
                "end0": min(x[0] + x[3] for x in r), "end": max(x[0] + x[3] for x in r),
                "t0s": [x[0] for x in r], "sms": len(set(x[4] for x in r)),
                "readys": [x[0] + x[2] for x in r],
            })
    inst.sort(key=lambda x: x["start"])
    if not inst:
        print("b1trace: no records in %s" % path)
        return 1
    seq = ["qkv", "attn", "O", "gate/up", "down"]
    layers, i = [], 0
    while i + 5 <= len(inst):
        if [x["kind"] for x in inst[i:i + 5]] == seq:
            layers.append(inst[i:i + 5])
            i += 5
        else:
            i += 1
    rows = {kd: [] for kd in seq}
    layer_us, edge_us, edge_qkv_us, step_us, step_layers = [], [], [], [], []
    comb = {}  # the attention split combine's chain, per layer
    edge_parts = {}  # what runs between a step's last layer and the next step's first QKV
    first = 0  # index of the current step's first layer
    for j in range(1, len(layers)):
        prev = layers[j - 1][4]
        if layers[j][0]["start"] - prev["end"] > 20000:  # a new step (lm_head and sampling between)
            edge_us.append((layers[j][0]["start"] - prev["end"]) / 1e3)
            for x in inst:
                if x["kind"] in ("lm_head", "draw", "put", "embed") and prev["end"] - 50000 < x["start"] < layers[j][0]["start"]:
                    for f in ("start", "wait1", "end"):
                        edge_parts.setdefault((x["kind"], f), []).append((x[f] - prev["end"]) / 1e3)
            edge_qkv_us.append((layers[j][0]["end"] - layers[j][0]["start"]) / 1e3)
            if first > 0:  # a whole step: from its first QKV block to the next step's
                step_us.append((layers[j][0]["start"] - layers[first][0]["start"]) / 1e3)
                step_layers.append(j - first)
            first = j
            continue
        layer_us.append((layers[j][4]["end"] - prev["end"]) / 1e3)
        at = layers[j][1]
        cs = [c for c in combines if at["start"] <= c[3] <= at["end"]]
        if cs:  # the split combine: ns after the last piece stored
            last = at["ready1"]
            comb.setdefault("count0", []).append((min(c[0] for c in cs) - last) / 1e3)
            comb.setdefault("count1", []).append((max(c[0] for c in cs) - last) / 1e3)
            comb.setdefault("ml", []).append(statistics.median(c[1] - c[0] for c in cs) / 1e3)
            comb.setdefault("pieces", []).append(statistics.median(c[2] - c[1] for c in cs) / 1e3)
            comb.setdefault("stored1", []).append((max(c[2] for c in cs) - last) / 1e3)
            comb.setdefault("end", []).append((at["end"] - last) / 1e3)
            rs = sorted(at["readys"])
            comb.setdefault("piece_p50", []).append((rs[len(rs) // 2] - last) / 1e3)
            comb.setdefault("n", []).append(len(cs))
        p = prev
        for x in layers[j]:
            e = p["end"]
            rows[x["kind"]].append({
                "start": (x["start"] - e) / 1e3,
                "before": sum(1 for t in x["t0s"] if t < e),
                "last_start": (x["last_start"] - e) / 1e3,
                "wait0": (x["wait0"] - e) / 1e3, "wait1": (x["wait1"] - e) / 1e3,
                "ready1": (x["ready1"] - e) / 1e3, "end0": (x["end0"] - e) / 1e3,
                "end": (x["end"] - e) / 1e3, "m": x["m"], "k": x["k"], "grid": x["grid"], "sms": x["sms"],
            })
            p = x
    if not layer_us:
        print("b1trace: no two consecutive whole layers in %s (%d launches)" % (path, len(inst)))
        return 1
    ts = sorted(set(t for x in inst for t in x["t0s"]))
    steps = [b - a for a, b in zip(ts, ts[1:]) if b > a]
    med = lambda v: statistics.median(v) if v else float("nan")
    print("b1trace: %d layers (medians; us after the previous kernel's last block ended; timer step >= %d ns)"
          % (len(layer_us), min(steps) if steps else 0))
    print("%-8s %6s %4s %5s %7s %6s %7s %7s %7s %7s %7s %7s %7s" % ("kernel", "grid", "sms", "early", "start", "last",
          "wait0", "wait1", "ready", "end0", "end", "ideal", "bytes%"))
    total_ideal = 0.0
    for kd in seq:
        r = rows[kd]
        if not r:
            continue
        ideal = r[0]["m"] * r[0]["k"] * 2 / (bw * 1e3) if kd != "attn" else 0.0
        total_ideal += ideal
        end = med([x["end"] for x in r])
        print("%-8s %6d %4d %5d %7.2f %6.2f %7.2f %7.2f %7.2f %7.2f %7.2f %7.2f %6s" % (
            kd, r[0]["grid"], med([x["sms"] for x in r]), med([x["before"] for x in r]), med([x["start"] for x in r]),
            med([x["last_start"] for x in r]), med([x["wait0"] for x in r]), med([x["wait1"] for x in r]),
            med([x["ready1"] for x in r]), med([x["end0"] for x in r]), end, ideal,
            "%.0f%%" % (100 * ideal / end) if kd != "attn" and end > 0 else "-"))
    print("layer: %.2f us (median; min %.2f, max %.2f); its GEMVs' bytes at %.0f GB/s: %.2f us (%.1f%%)" % (
        med(layer_us), min(layer_us), max(layer_us), bw, total_ideal, 100 * total_ideal / med(layer_us)))
    if edge_us:
        print("step edge: %.2f us (median of %d) from a step's last layer's end to the next step's first QKV block: the"
              " lm_head, the draw, the copies, the embedding; that first QKV then takes %.2f us (start to end)" % (
                  med(edge_us), len(edge_us), med(edge_qkv_us)))
    if edge_parts:
        print("  in it (us after the last layer's end; medians): " + ", ".join(
            "%s %.2f..%.2f (past its wait %.2f)" % (kd, med(edge_parts[(kd, "start")]), med(edge_parts[(kd, "end")]),
                                                   med(edge_parts[(kd, "wait1")]))
            for kd in ("lm_head", "draw", "put", "embed") if (kd, "start") in edge_parts) +
            "; the next QKV's first block at %.2f" % med(edge_us))
    if step_us:
        print("step: %.1f us (median of %d, %d layers) = %d x the layer median + %.1f us" % (
            med(step_us), len(step_us), med(step_layers), med(step_layers), med(step_us) - med(step_layers) * med(layer_us)))
    if comb:
        print("attention's split combine (us after the last piece stored; medians over layers; %d combining blocks):"
              " median piece %.2f, count back first %.2f / last %.2f, then m and l %.2f, then the outputs %.2f;"
              " last outputs stored %.2f, kernel's last block ends %.2f" % (
                  med(comb["n"]), med(comb["piece_p50"]), med(comb["count0"]), med(comb["count1"]), med(comb["ml"]),
                  med(comb["pieces"]), med(comb["stored1"]), med(comb["end"])))
    print("columns: sms = SMs the launch's blocks ran on (fewer than the grid: some held two or more);")
    print("  early = blocks started before the previous kernel ended; start/last = first/last block start;")
    print("  wait0/wait1 = first/last block past the wait; ready = last prologue done (attention: last partial")
    print("  stored); end0/end = first/last block end = this kernel's share of the layer time")
    return 0


if __name__ == "__main__":
    sys.exit(main())
