#!/usr/bin/env python3
"""Warp-stall samples of a warp-specialised kernel, by role, from ncu's SASS page.

Reads the CSV that `ncu --import R.ncu-rep --page source --print-source sass --csv` writes (the profile stages
leave it as logs/ncu-*-sass.csv) and splits the first warp-specialised kernel's instructions at its register
reallocations: each `USETMAXREG.TRY_ALLOC` opens a role that takes registers (in SASS order: the pingpong single
pass's dK warpgroup, then its consumers), `USETMAXREG.DEALLOC` the part of the roles that gives them back (the
producer); what precedes the first is the prologue. Prints each part's share of the samples, its stall reasons'
shares and its hottest lines.

    scripts/ncu_stalls.py logs/ncu-sp-c8-S1024-sass.csv [--top 12]
"""
import argparse
import sys

from ncu_blocks import number, read_kernels

SAMPLES = "Warp Stall Sampling (All Samples)"
MIN_SHARE = 0.01  # reasons below 1 % of a part's samples are not printed
REASONS = 7       # reasons printed per part


def parts(lines):
    """(name, first, end) of the prologue, each role that allocates registers, and the deallocating role."""
    marks = [(i, "DEALLOC" in r[1]) for i, r in enumerate(lines) if "USETMAXREG" in r[1]]
    if not any(not dealloc for _, dealloc in marks):
        return []
    out = [("prologue", 0, marks[0][0])]
    roles = 0
    for k, (i, dealloc) in enumerate(marks):
        end = marks[k + 1][0] if k + 1 < len(marks) else len(lines)
        if dealloc:
            out.append(("registers given back (the producer; every role's out-of-line wait loops)", i, end))
        else:
            roles += 1
            out.append((f"role {roles}, registers taken", i, end))
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv")
    parser.add_argument("--top", type=int, default=12, help="hottest lines to print per part")
    args = parser.parse_args()

    for _, names, lines in read_kernels(args.csv):
        split = parts(lines)
        if split:
            break
    else:
        sys.exit("no USETMAXREG.TRY_ALLOC in any kernel: no warp-specialised kernel")
    col = {n: i for i, n in enumerate(names)}
    reasons = [n for n in names if n.startswith("stall_") and "Not Issued" not in n]
    total = sum(number(r[col[SAMPLES]]) for r in lines)
    for name, first, end in split:
        part = lines[first:end]
        ours = sum(number(r[col[SAMPLES]]) for r in part)
        print(f"{name}: {ours:.0f} samples ({100 * ours / max(total, 1):.1f} %)")
        if ours == 0:
            continue
        shares = {n: sum(number(r[col[n]]) for r in part) / ours for n in reasons}
        top = [(n, s) for n, s in sorted(shares.items(), key=lambda kv: -kv[1]) if s >= MIN_SHARE][:REASONS]
        print("   " + "  ".join(f"{n[len('stall_'):]} {100 * s:.1f}" for n, s in top))
        for r in sorted(part, key=lambda r: -number(r[col[SAMPLES]]))[:args.top]:
            reason = max(reasons, key=lambda n: number(r[col[n]]))
            print(f"   {number(r[col[SAMPLES]]):7.0f}  {reason[len('stall_'):]:<16} {r[1][:80]}")


if __name__ == "__main__":
    main()
