import collections, sys
# lm_head: from its last block past the wait to its last block's end, per step (us)
for path in sys.argv[1:]:
    recs = collections.defaultdict(list)
    for line in open(path):
        if line.startswith('#') or not line.strip(): continue
        tag, m, k, grid, blk, sm, t0, dw, dr, de = [int(x) for x in line.split()]
        if tag == 17 and m > 32768: recs[grid].append((t0, dw, dr, de))
    for grid, r in recs.items():
        r.sort(); n = len(r) // grid * grid; r = r[len(r) - n:]
        print(path, ' '.join('%.2f' % ((max(x[0] + x[3] for x in r[i:i + grid]) - max(x[0] + x[1] for x in r[i:i + grid])) / 1e3) for i in range(0, n, grid)))
