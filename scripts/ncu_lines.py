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

--role N keeps the N-th role of a warp-specialised kernel (ncu_stalls.parts: from a `USETMAXREG.TRY_ALLOC` to
the next reallocation; the pingpong single pass's dK warpgroup is 1, its consumers 2). With --blocks (the blocks
that role ran, over all CTAs) the role's instructions are summed instead by their inlining chain in the project's
sources (`nvdisasm -gi`), outermost first, --depth frames below the role's entry (--under FILE:LINE: only below
that frame), and printed per warp (--warps per block) and block:

    scripts/ncu_lines.py logs/ncu-sp-c8-S1024-sass.csv sp_c8.cubin --function sp_pp_kernel --role 2 \
        --blocks 73728 --depth 2
"""

import argparse
import collections
import csv
import re
import shutil
import subprocess
import sys
from pathlib import Path

from ncu_stalls import parts

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"
OURS = re.compile(r"(^|/)(src|tests|bench)/")  # the project's sources (CUTLASS's and CUDA's frames are skipped)
DEPS = "/.deps/"  # the registries' headers under the checkout (CUTLASS), not the project's


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
    """{offset: (file, line, path)}, {offset: opcode} and {offset: chain} of one function of the cubin (nvdisasm
    -gi); a chain is the instruction's inlining chain, [(file, line)] innermost first."""
    text = subprocess.run([nvdisasm, "-gi", "-c", str(cubin)], check=True, capture_output=True, text=True).stdout
    functions = re.split(r"\n\s*\.text\.(\S+):", text)
    chosen = None
    for i in range(1, len(functions), 2):
        if function is None or function in functions[i]:
            chosen = functions[i + 1]
            break
    if chosen is None:
        sys.exit(f"no function matching '{function}' in {cubin}")
    where, opcodes, chains, chain, current, in_chain = {}, {}, {}, [], None, False
    for line in chosen.splitlines():
        m = re.match(r'\s*//## File "([^"]+)", line (\d+)', line)
        if m:
            if not in_chain:
                chain, current = [], (Path(m.group(1)).name, int(m.group(2)), m.group(1))
            chain.append((m.group(1), int(m.group(2))))
            in_chain = True
            continue
        in_chain = False
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*)", line)
        if m:
            offset = int(m.group(1), 16)
            tokens = [t for t in m.group(2).split() if not t.startswith("@")]  # no predicate
            where[offset], opcodes[offset] = current, tokens[0].rstrip(";") if tokens else "?"
            chains[offset] = chain
    return where, opcodes, chains


def by_chain(rows, col, base, chains, args):
    """The rows' executed instructions per warp and block, by their frames in the project's sources."""
    executed, samples = collections.Counter(), collections.Counter()
    scale = args.blocks * args.warps
    for r in rows:
        frames = [f"{Path(f).name}:{n}" for f, n in reversed(chains.get(int(r[0], 16) - base, []))
                  if OURS.search(f) and DEPS not in f]
        if args.under:
            if args.under not in frames:
                continue
            frames = frames[frames.index(args.under):]
        key = " > ".join(frames[1:1 + args.depth]) or (frames[0] if frames else "?")
        executed[key] += float(r[col[EXECUTED]] or 0)
        samples[key] += float(r[col[SAMPLES]] or 0)
    total, sampled = sum(executed.values()), sum(samples.values()) or 1.0
    print(f"{total / scale:.0f} instructions per warp and block")
    print(f"{'instrs':>8} {'samples':>8}  frames (outermost first)")
    for key, n in executed.most_common(args.top):
        print(f"{n / scale:8.1f} {100 * samples[key] / sampled:7.1f}%  {key}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv", type=Path)
    parser.add_argument("cubin", type=Path)
    parser.add_argument("--kernel", type=int, default=0)
    parser.add_argument("--function", help="a substring of the mangled name in the cubin (default: the first)")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--nvdisasm", default=shutil.which("nvdisasm") or "nvdisasm")
    parser.add_argument("--role", type=int, help="only the N-th role that takes registers (1 = first)")
    parser.add_argument("--blocks", type=float, help="the blocks the role ran: instructions by inlining chain")
    parser.add_argument("--warps", type=int, default=4, help="the warps that run a block (with --blocks)")
    parser.add_argument("--depth", type=int, default=2, help="frames below the role's entry (with --blocks)")
    parser.add_argument("--under", default="", help="only below this frame, FILE:LINE (with --blocks)")
    args = parser.parse_args()

    name, header, rows = kernel_blocks(args.csv)[args.kernel]
    col = {n: i for i, n in enumerate(header)}
    where, opcodes, chains = source_lines(args.cubin, args.nvdisasm, args.function)
    base = int(rows[0][0], 16)
    mismatches = sum(1 for r in rows if opcodes.get(int(r[0], 16) - base, "?").split(".")[0] not in r[1])
    print(f"{name[:120]}\n{len(rows)} instructions profiled, {len(opcodes)} in the cubin, "
          f"{mismatches} opcode mismatches (0: same build)")
    if args.role is not None:
        roles = [p for p in parts(rows) if p[0].startswith("role ")]
        if not 1 <= args.role <= len(roles):
            sys.exit(f"--role {args.role}: the kernel has {len(roles)} roles that take registers")
        _, first, end = roles[args.role - 1]
        rows = rows[first:end]
        print(f"role {args.role}: {len(rows)} instructions")
    if args.blocks:
        if mismatches:
            sys.exit("not the profiled build: no per-block figures")
        by_chain(rows, col, base, chains, args)
        return
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
