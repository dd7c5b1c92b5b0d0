#!/usr/bin/env python3
"""Causal balance of the single pass in clusters (docs/DESIGN.md, "Rows of up to 1024 keys: clusters").

A cluster of C CTAs of 128 keys walks heads of T row blocks of 64 rows (causal, Sq = Sk = 64 T). Row block t of
head i is a block of every CTA whose key block kb (owner(i, r) for CTA r) it sees (t >= 2 kb). Each CTA does its
blocks one at a time in its own order (order(block, r)); a block's statistics exchange makes its participants wait
for the last of them to start it. Printed: the work over C times the makespan (1: no CTA ever idle), or a deadlock
where two CTAs meet their common blocks in different orders.

    python3 scripts/cluster_balance.py
"""


def balance(C, T, heads, owner, order):
    seq = {r: [] for r in range(C)}
    parts = {}
    for i in range(heads):
        for t in range(T):
            parts[(i, t)] = [r for r in range(C) if t >= 2 * owner(i, r)]
            for r in parts[(i, t)]:
                seq[r].append((i, t))
    for r in range(C):
        seq[r].sort(key=lambda b, r=r: order(b, r))
    at = {r: 0 for r in range(C)}
    free = {r: 0.0 for r in range(C)}
    started = {}
    done, total = 0, sum(len(s) for s in seq.values())
    while done < total:
        moved = False
        for r in range(C):
            if at[r] == len(seq[r]):
                continue
            b = seq[r][at[r]]
            started.setdefault(b, {}).setdefault(r, free[r])
            if len(started[b]) == len(parts[b]):
                end = max(started[b].values()) + 1
                for q in parts[b]:
                    free[q] = end
                    at[q] += 1
                    done += 1
                moved = True
        if not moved:
            return None
    return total / (C * max(free.values()))


def main():
    heads = 64
    for C, T in ((2, 4), (4, 8), (8, 16)):
        contiguous = lambda i, r: r
        mirrored = lambda i, r, C=C: r if i % 2 == 0 else C - 1 - r
        head_major = lambda b, r: b
        rows = {}
        rows["contiguous, head by head"] = balance(C, T, heads, contiguous, head_major)
        rows["mirrored pairs, head by head"] = balance(C, T, heads, mirrored, head_major)
        # Two heads in flight per CTA (two dK accumulators): the pair's row blocks interleaved, t of A then t of B.
        rows["mirrored pairs, two heads in flight"] = balance(C, T, heads, mirrored,
                                                             lambda b, r: (b[0] // 2, b[1], b[0] % 2))
        # Each CTA its shorter part of the pair first (one accumulator): the pairs meet in different orders.
        def shorter_first(b, r, C=C, T=T):
            a_first = T - 2 * r <= T - 2 * (C - 1 - r)
            return (b[0] // 2, 0 if (b[0] % 2 == 0) == a_first else 1, b[1])
        rows["mirrored pairs, shorter part first"] = balance(C, T, heads, mirrored, shorter_first)
        for name, value in rows.items():
            print(f"C = {C}, S = {64 * T}: {name}: " + ("deadlock" if value is None else f"{100 * value:.1f} %"))


if __name__ == "__main__":
    main()
