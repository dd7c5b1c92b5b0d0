#!/usr/bin/env python3
"""What adding dQ as 16-bit partials costs in accuracy (docs/DESIGN.md, the two-pass backward's direct dQ).

The key-block pass computes one dQ partial per 128-key block. Added straight into a 16-bit dQ, each partial
is rounded to 16 bits and every sum is rounded again (TMA reduce-add in L2, in whatever order the CTAs finish).
This measures, in fp64 on the CPU, the relative Frobenius error ‖out − ref‖ / ‖ref‖ (the contract's measure)
of three ways of forming dQ from exact partials, for a causal row of S keys with N(0, 1) Q, K and dP:
  output:   the exact sum rounded once (what any 16-bit output costs)
  partials: the partials rounded, summed exactly, the sum rounded
  direct:   the partials rounded and added one by one into a 16-bit sum, each addition rounded
Only rounding is modelled: the products' own errors (dS in 16 bits, fp32 accumulation) come on top, as they do
for the fp32 accumulator.

    python3 scripts/dq_rounding.py [--seq 1024] [--block 128] [--head-dim 128] [--seed 0]
"""
import argparse

import numpy as np


def round_bf16(x):
    """Round-to-nearest-even to bfloat16, returned as float64."""
    f = np.asarray(x, dtype=np.float32)
    bits = f.view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(np.float32).astype(np.float64)


def round_fp16(x):
    return np.asarray(x, dtype=np.float16).astype(np.float64)


def partials(seq, block, head_dim, rng):
    """The exact per-column-block partials of dQ = scale · dS K for one causal head, (blocks, seq, head_dim)."""
    q, k, dp = (rng.standard_normal(shape) for shape in ((seq, head_dim), (seq, head_dim), (seq, seq)))
    scale = head_dim ** -0.5
    s = scale * q @ k.T
    s[np.triu_indices(seq, 1)] = -np.inf
    p = np.exp(s - s.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    dp[np.triu_indices(seq, 1)] = 0.0
    ds = p * (dp - (p * dp).sum(axis=1, keepdims=True))
    return np.stack([scale * ds[:, c:c + block] @ k[c:c + block] for c in range(0, seq, block)])


def rel(out, ref):
    return np.linalg.norm(out - ref) / np.linalg.norm(ref)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--block", type=int, default=128)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    parts = partials(args.seq, args.block, args.head_dim, np.random.default_rng(args.seed))
    ref = parts.sum(axis=0)
    print(f"S = {args.seq}, {len(parts)} partials of {args.block} keys, D = {args.head_dim}, causal")
    for name, rnd in (("bfloat16", round_bf16), ("float16", round_fp16)):
        direct = np.zeros_like(ref)
        for part in parts:
            direct = rnd(direct + rnd(part))
        errors = {"output": rel(rnd(ref), ref), "partials": rel(rnd(sum(rnd(x) for x in parts)), ref),
                  "direct": rel(direct, ref)}
        print(f"{name:9s} " + "  ".join(f"{k} {v:.2e}" for k, v in errors.items()))


if __name__ == "__main__":
    main()
