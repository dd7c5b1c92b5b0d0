#!/usr/bin/env python3
"""Warp-stall samples of a warp-specialised kernel, by role, from ncu's SASS page.

Reads the CSV that `ncu --import R.ncu-rep --page source --print-source sass --csv` writes (gpu-check's profile
stage leaves it as logs/ncu-*-sass.csv) and splits the instructions at the register reallocation: the code
between `USETMAXREG.TRY_ALLOC` (the consumers take their registers) and `USETMAXREG.DEALLOC` (the producer
warpgroup gives its own back) is the consumers' main loop; the rest is the producer, the dQ reducers and the
prologue. Prints, for the consumers, each stall reason's share of their samples and their hottest lines.

    scripts/ncu_stalls.py logs/ncu-recompute-S1024-sass.csv [--top 20]
"""
import argparse
import sys

from ncu_blocks import number, read_kernels

SAMPLES = "Warp Stall Sampling (All Samples)"
MIN_SHARE = 0.01  # reasons below 1 % of the samples are not printed


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv")
    parser.add_argument("--top", type=int, default=20, help="hottest consumer lines to print")
    args = parser.parse_args()

    # the first warp-specialised kernel of the CSV (the others, such as the row statistics, have no roles)
    for _, names, lines in read_kernels(args.csv):
        starts = [i for i, r in enumerate(lines) if "USETMAXREG.TRY_ALLOC" in r[1]]
        ends = [i for i, r in enumerate(lines) if "USETMAXREG.DEALLOC" in r[1]]
        if starts and ends:
            break
    else:
        sys.exit("no USETMAXREG pair in any kernel: no warp-specialised kernel")
    col = {n: i for i, n in enumerate(names)}
    reasons = [n for n in names if n.startswith("stall_") and "Not Issued" not in n]
    consumers = lines[starts[0]:ends[0]]

    total = sum(number(r[col[SAMPLES]]) for r in lines)
    ours = sum(number(r[col[SAMPLES]]) for r in consumers)
    print(f"consumer samples {ours:.0f} of {total:.0f} ({100 * ours / max(total, 1):.1f} %)")
    shares = {n: sum(number(r[col[n]]) for r in consumers) / max(ours, 1) for n in reasons}
    for name, share in sorted(shares.items(), key=lambda kv: -kv[1]):
        if share >= MIN_SHARE:
            print(f"  {name:<24} {100 * share:5.1f} %")
    print("hottest consumer lines (samples, main reason, instruction):")
    for r in sorted(consumers, key=lambda r: -number(r[col[SAMPLES]]))[:args.top]:
        reason = max(reasons, key=lambda n: number(r[col[n]]))
        print(f"  {number(r[col[SAMPLES]]):7.0f}  {reason:<18} {r[1][:90]}")


if __name__ == "__main__":
    main()
