#!/usr/bin/env python3
"""One line per kernel launch from `ncu --csv --page details` (gpu-check's stage kernels): its time, DRAM bytes
read and written, L2 bytes and the SpeedOfLight section's throughputs.

    scripts/ncu_kernels.py --title "main recompute 8,128,1024,128" logs/kernels-....csv
"""
import argparse
import csv
import sys

WANTED = {
    "Duration": "us",
    "dram__bytes_read.sum": "DRAM rd",
    "dram__bytes_write.sum": "DRAM wr",
    "lts__t_bytes.sum": "L2",
    "DRAM Throughput": "DRAM %",
    "Compute (SM) Throughput": "SM %",
    "L2 Cache Throughput": "L2 %",
}
SCALE = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6, "byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}


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
        if name in WANTED and value is not None:
            if name == "Duration":
                value *= SCALE.get(unit, 1.0)
            elif unit in SCALE and unit != "us":
                value *= SCALE[unit]
            launches.setdefault(key, {})[name] = value
    print(f"## {args.title}")
    print(f"{'kernel':40s} {'us':>9s} {'DRAM rd GB':>10s} {'DRAM wr GB':>10s} {'L2 GB':>8s} {'DRAM %':>7s} {'SM %':>6s} {'L2 %':>6s}")
    total = 0.0
    for (lid, kernel), v in launches.items():
        short = kernel.split("(")[0].replace("void ", "")[:40]
        g = lambda k, d=1e9: v.get(k, float("nan")) / d
        total += v.get("Duration", 0.0)
        print(f"{short:40s} {v.get('Duration', float('nan')):9.1f} {g('dram__bytes_read.sum'):10.3f} "
              f"{g('dram__bytes_write.sum'):10.3f} {g('lts__t_bytes.sum'):8.3f} "
              f"{v.get('DRAM Throughput', float('nan')):7.1f} "
              f"{v.get('Compute (SM) Throughput', float('nan')):6.1f} {v.get('L2 Cache Throughput', float('nan')):6.1f}")
    print(f"{'total':40s} {total:9.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
