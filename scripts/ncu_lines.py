#!/usr/bin/env python3
"""Stall samples and executed instructions of an ncu profile, per source line.

The profile stage of scripts/gpu-check.sh saves, per mode, `logs/ncu-<mode>-sass.csv` (ncu's source page:
one row per SASS instruction with its samples). ncu's CLI does not print the source line of each
instruction, but `nvdisasm -g` of the same kernel built with -lineinfo does: this script joins the two by
instruction offset. Build the cubin with the same nvcc as the profiled binary (it checks that the opcodes
match), e.g. for the saved-P fused kernel:

    nvcc -O3 -DNDEBUG -arch=sm_90a --expt-relaxed-constexpr -lineinfo -std=c++17 -cubin -I include -I src \\
         -isystem .deps/cutlass/include -o fused.cubin src/cuda/sm90_fused_bf16_savedp_hd128.cu
    scripts/ncu_lines.py logs/ncu-saved_p-sass.csv fused.cubin --top 40

With several kernels in the CSV (one block each), --kernel N picks the N-th (0 = first).
"""

import argparse
import collections
import csv
import re
import shutil
import subprocess
import sys
from pathlib import Path

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def kernel_blocks(path):
    """The CSV's kernels: [(name, header, rows)], one per 'Kernel Name' block."""
    rows = list(csv.reader(open(path, newline="")))
    starts = [i for i, r in enumerate(rows) if r and r[0] == "Address"]
    blocks = []
    for n, start in enumerate(starts):
        end = starts[n + 1] - 1 if n + 1 < len(starts) else len(rows)
        name = rows[start - 1][1] if start > 0 and len(rows[start - 1]) > 1 else "?"
        blocks.append((name, rows[start], [r for r in rows[start + 1:end] if len(r) > 2]))
    return blocks


def source_lines(cubin, nvdisasm, function):
    """{offset: (file, line)} and {offset: opcode} of one function of the cubin (nvdisasm -g)."""
    text = subprocess.run([nvdisasm, "-g", "-c", str(cubin)], check=True, capture_output=True, text=True).stdout
    functions = re.split(r"\n\s*\.text\.(\S+):", text)
    chosen = None
    for i in range(1, len(functions), 2):
        if function is None or function in functions[i]:
            chosen = functions[i + 1]
            break
    if chosen is None:
        sys.exit(f"no function matching '{function}' in {cubin}")
    where, opcodes, current = {}, {}, None
    for line in chosen.splitlines():
        m = re.match(r'\s*//## File "([^"]+)", line (\d+)', line)
        if m:
            current = (Path(m.group(1)).name, int(m.group(2)), m.group(1))
            continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*)", line)
        if m:
            offset = int(m.group(1), 16)
            tokens = [t for t in m.group(2).split() if not t.startswith("@")]  # no predicate
            where[offset], opcodes[offset] = current, tokens[0].rstrip(";") if tokens else "?"
    return where, opcodes


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv", type=Path)
    parser.add_argument("cubin", type=Path)
    parser.add_argument("--kernel", type=int, default=0)
    parser.add_argument("--function", help="a substring of the mangled name in the cubin (default: the first)")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--nvdisasm", default=shutil.which("nvdisasm") or "nvdisasm")
    args = parser.parse_args()

    name, header, rows = kernel_blocks(args.csv)[args.kernel]
    col = {n: i for i, n in enumerate(header)}
    where, opcodes = source_lines(args.cubin, args.nvdisasm, args.function)
    base = int(rows[0][0], 16)
    mismatches = sum(1 for r in rows if opcodes.get(int(r[0], 16) - base, "?").split(".")[0] not in r[1])
    print(f"{name[:120]}\n{len(rows)} instructions profiled, {len(opcodes)} in the cubin, "
          f"{mismatches} opcode mismatches (0: same build)")
    samples, executed = collections.Counter(), collections.Counter()
    for r in rows:
        key = where.get(int(r[0], 16) - base)
        samples[key] += float(r[col[SAMPLES]] or 0)
        executed[key] += float(r[col[EXECUTED]] or 0)
    total_s, total_e = sum(samples.values()) or 1.0, sum(executed.values()) or 1.0
    print(f"{'samples':>8} {'instrs':>7}  source")
    for key, s in samples.most_common(args.top):
        text = ""
        if key and Path(key[2]).exists():
            text = Path(key[2]).read_text().splitlines()[key[1] - 1].strip()[:80]
        label = f"{key[0]}:{key[1]}" if key else "?"
        print(f"{100 * s / total_s:7.1f}% {100 * executed[key] / total_e:6.1f}%  {label:28s} {text}")


if __name__ == "__main__":
    main()
