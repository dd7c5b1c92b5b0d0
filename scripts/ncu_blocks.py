#!/usr/bin/env python3
"""Where a kernel's executed instructions go, from ncu's SASS page.

Reads the CSV that `ncu --import R.ncu-rep --page source --print-source sass --csv` writes (gpu-check's profile
stage leaves it as logs/ncu-*-sass.csv; one section per kernel profiled) and prints, per kernel, its executed
warp instructions, their opcodes' shares, and its heaviest runs: consecutive SASS lines executed equally often
(straight-line code, such as one unrolled element-wise loop), by instructions executed in all. A run's count
over a kernel's steps gives the run's instructions per step (the execution count of a line that runs once per
warp and step is warps × steps).

    scripts/ncu_blocks.py logs/ncu-recompute-S1024-sass.csv [--top 15]
"""
import argparse
import collections
import csv
import re

EXECUTED = "Instructions Executed"
OPCODES = 10  # opcodes printed per kernel and per run
PREDICATE = re.compile(r"^@!?U?P[T0-9]+\s+")


def number(text):
    """A CSV cell as a number (ncu writes thousands separators; an empty or non-numeric cell is 0)."""
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def opcode(sass):
    text = PREDICATE.sub("", sass.strip())
    return text.split()[0].split(".")[0] if text else "?"


def read_kernels(path):
    """(name, header, lines) per kernel section of the CSV at path."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    name, header, lines = None, None, []
    for row in rows:
        if row and row[0] == "Kernel Name":
            if name and header:
                yield name, header, lines
            name, header, lines = row[1], None, []
        elif row and row[0] == "Address":
            header = row
        elif header and len(row) == len(header):
            lines.append(row)
    if name and header:
        yield name, header, lines


def report(name, header, lines, top):
    column = header.index(EXECUTED)
    counts = [int(number(r[column])) for r in lines]
    total = sum(counts)
    print(f"{name[:110]}\n  executed warp instructions {total:,} over {len(lines)} SASS lines")
    if total == 0:
        return
    mix = collections.Counter()
    for row, count in zip(lines, counts):
        mix[opcode(row[1])] += count
    print("  opcodes: " + "  ".join(f"{op} {100 * n / total:.1f}%" for op, n in mix.most_common(OPCODES)))
    runs = []  # [first line, count, length]
    for i, count in enumerate(counts):
        if runs and runs[-1][1] == count and runs[-1][0] + runs[-1][2] == i:
            runs[-1][2] += 1
        else:
            runs.append([i, count, 1])
    runs.sort(key=lambda r: -r[1] * r[2])
    print(f"  {'line':>6} {'length':>6} {'executed':>10} {'share':>6}  opcodes")
    for first, count, length in runs[:top]:
        if count == 0:
            break
        ops = collections.Counter(opcode(lines[j][1]) for j in range(first, first + length))
        print(f"  {first:6d} {length:6d} {count:10,d} {100 * count * length / total:5.1f}%  " +
              " ".join(f"{op}:{n}" for op, n in ops.most_common(OPCODES)))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv")
    parser.add_argument("--top", type=int, default=15, help="heaviest runs to print per kernel")
    args = parser.parse_args()
    for name, header, lines in read_kernels(args.csv):
        report(name, header, lines, args.top)


if __name__ == "__main__":
    main()
