#!/usr/bin/env python3
"""Side by side: the phase traces of `qksoftmax-step --trace` logs (one per revision), cycles per step of the
first consumer warpgroup by phase, for one mode and cluster size of the single pass or, with --kb, one mode and dQ
target of the key-block pass, with each revision's change against the first.

    scripts/trace_table.py [--mode recompute] [--cluster 8 | --kb bf16] NAME=LOG [NAME=LOG ...]
"""

import argparse
import re
import sys
from pathlib import Path

CASE = re.compile(r"^(\w+), cluster (\d+): ([\d.]+) us per step$")
CONSUMER = re.compile(r"^  (\S.*?)\s+(\d+)\s+(\d+)$")
OTHER = re.compile(r"^  reducer (.+?)\s+(\d+)\s+producer (.+?)\s+(\d+)$")
KB_CASE = re.compile(r"^kb (\w+), dq (\w+): ([\d.]+) us per step$")
KB_OTHER = re.compile(r"^  load (.+?)\s+(\d+)\s+rows (.+?)\s+(\d+)\s+dq (.+?)\s+(\d+)$")


def parse(text: str) -> dict[tuple[str, int | str], dict[str, float]]:
    """(mode, cluster) of the single pass, (mode, "kb " + dQ target) of the key-block pass → phase → cycles per
    step (consumer phases from warpgroup 1; 'step us' the time)."""
    cases: dict[tuple[str, int | str], dict[str, float]] = {}
    current: dict[str, float] | None = None
    for line in text.splitlines():
        if m := CASE.match(line):
            current = cases.setdefault((m[1], int(m[2])), {"step us": float(m[3])})
        elif m := KB_CASE.match(line):
            current = cases.setdefault((m[1], f"kb {m[2]}"), {"step us": float(m[3])})
        elif current is not None and (m := KB_OTHER.match(line)):
            for role, i in (("load", 1), ("rows", 3), ("dq", 5)):
                current[f"{role} {m[i]}"] = float(m[i + 1])
        elif current is not None and (m := OTHER.match(line)):
            current[f"reducer {m[1]}"] = float(m[2])
            current[f"producer {m[3]}"] = float(m[4])
        elif current is not None and (m := CONSUMER.match(line)) and m[1] != "consumer":
            current[m[1]] = float(m[2])
    return cases


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", default="recompute")
    parser.add_argument("--cluster", type=int, default=8)
    parser.add_argument("--kb", metavar="DQ", help="the key-block pass's case with this dQ target (bf16, fp32)")
    parser.add_argument("logs", nargs="+", metavar="NAME=LOG")
    args = parser.parse_args(argv)
    case = f"kb {args.kb}" if args.kb else args.cluster
    label = f"key-block dq {args.kb}" if args.kb else f"cluster {args.cluster}"
    columns = []
    for item in args.logs:
        name, _, path = item.partition("=")
        phases = parse(Path(path).read_text(errors="replace")).get((args.mode, case))
        if phases is None:
            print(f"trace_table: no {args.mode} trace at {label} in {path}", file=sys.stderr)
            return 1
        columns.append((name, phases))
    rows = list(columns[0][1])
    for _, phases in columns[1:]:
        rows += [r for r in phases if r not in rows]
    print(f"{args.mode}, {label}: cycles per step (first consumer warpgroup), change against "
          f"{columns[0][0]}")
    print(f"{'phase':24}" + "".join(f"{name:>20}" for name, _ in columns))
    base = columns[0][1]
    for row in rows:
        cells = []
        for i, (_, phases) in enumerate(columns):
            value = phases.get(row)
            if value is None:
                cells.append(f"{'—':>20}")
            elif i == 0 or row not in base:
                cells.append(f"{value:>20.{3 if row == 'step us' else 0}f}")
            else:
                delta = value - base[row]
                digits = 3 if row == "step us" else 0
                cells.append(f"{value:>11.{digits}f} ({delta:+.{digits}f})".rjust(20))
        print(f"{row:24}" + "".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
