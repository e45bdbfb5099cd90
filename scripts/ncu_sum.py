#!/usr/bin/env python3
"""Per-kernel GPU time from an Nsight Compute CSV (docs/perf-notes.md, session 18):

    ncu --clock-control none --metrics gpu__time_duration.sum --csv kcp_gpu_bench ARGS > k.csv
    python3 scripts/ncu_sum.py k.csv ITERATIONS

sums gpu__time_duration.sum per kernel name (template arguments kept, parameters dropped) and
prints ms per iteration, largest first, with launches per iteration. ITERATIONS: how many times the
profiled program ran the whole forward + backward (kcp_gpu_bench with repeats R runs 2 warm-ups, R
timed runs with per-phase events and R without: 2 R + 2, e.g. 4 for R = 1). Lines before the CSV
header (the program's own output) are skipped.
"""
import collections
import csv
import sys

SCALE_MS = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0}


def main(argv):
    if len(argv) != 3:
        sys.exit(__doc__)
    iters = float(argv[2])
    total, launches, hdr = collections.defaultdict(float), collections.Counter(), None
    with open(argv[1], newline="") as f:
        for row in csv.reader(f):
            if hdr is None:
                hdr = row if "Kernel Name" in row and "Metric Value" in row else None
                continue
            d = dict(zip(hdr, row))
            if d.get("Metric Name") != "gpu__time_duration.sum":
                continue
            unit = d.get("Metric Unit", "nsecond")
            if unit not in SCALE_MS:
                sys.exit(f"ncu_sum: unknown unit {unit!r} in {argv[1]}")
            name = d["Kernel Name"].split("(")[0]
            total[name] += float(d["Metric Value"].replace(",", "")) * SCALE_MS[unit]
            launches[name] += 1
    if hdr is None:
        sys.exit(f"ncu_sum: no CSV header with 'Kernel Name' and 'Metric Value' in {argv[1]}")
    print(f"total {sum(total.values()) / iters:.3f} ms per iteration over {len(total)} kernels")
    for name, ms in sorted(total.items(), key=lambda x: -x[1]):
        print(f"{ms / iters:9.3f} ms {launches[name] / iters:5.1f}/it  {name}")


if __name__ == "__main__":
    main(sys.argv)
