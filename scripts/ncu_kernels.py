#!/usr/bin/env python3
"""One line per kernel launch from `ncu --csv --page details` (gpu-check's stage kernels): its time, DRAM bytes
read and written, L2 bytes and the SpeedOfLight section's throughputs.

    scripts/ncu_kernels.py --title "main recompute 8,128,1024,128" logs/kernels-....csv
"""
import argparse
import csv
import sys

# ncu's metric (or SpeedOfLight line) -> (column, divisor into the unit printed, format)
COLUMNS = {
    "Duration": ("us", 1.0, "9.1f"),
    "dram__bytes_read.sum": ("DRAM rd GB", 1e9, "10.3f"),
    "dram__bytes_write.sum": ("DRAM wr GB", 1e9, "10.3f"),
    "lts__t_bytes.sum": ("L2 GB", 1e9, "8.3f"),
    "DRAM Throughput": ("DRAM %", 1.0, "7.1f"),
    "Compute (SM) Throughput": ("SM %", 1.0, "6.1f"),
    "L2 Cache Throughput": ("L2 %", 1.0, "6.1f"),
}
SCALE = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3, "s": 1e6, "second": 1e6,
         "byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}  # into µs and bytes


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv")
    parser.add_argument("--title", default="")
    args = parser.parse_args()
    with open(args.csv, newline="") as f:
        lines = [l for l in f if l.startswith('"')]
    rows = list(csv.reader(lines))
    if not rows:
        print(f"{args.title}: no ncu rows in {args.csv}")
        return 1
    col = {n: i for i, n in enumerate(rows[0])}
    launches = {}
    for r in rows[1:]:
        key = (r[col["ID"]], r[col["Kernel Name"]])
        name, unit, value = r[col["Metric Name"]], r[col["Metric Unit"]], number(r[col["Metric Value"]])
        if name in COLUMNS and value is not None:
            value *= SCALE.get(unit, 1.0)
            launches.setdefault(key, {})[name] = value
    print(f"## {args.title}")
    widths = {metric: int(fmt.split(".")[0]) for metric, (_, _, fmt) in COLUMNS.items()}
    print(f"{'kernel':40s} " + " ".join(f"{label:>{widths[m]}s}" for m, (label, _, _) in COLUMNS.items()))
    total = 0.0
    for (_, kernel), v in launches.items():
        short = kernel.split("(")[0].replace("void ", "")[:40]
        total += v.get("Duration", 0.0)
        cells = (format(v.get(m, float("nan")) / div, fmt) for m, (_, div, fmt) in COLUMNS.items())
        print(f"{short:40s} " + " ".join(cells))
    print(f"{'total':40s} {total:9.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
