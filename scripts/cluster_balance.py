#!/usr/bin/env python3
"""Causal balance of the single pass in clusters (docs/DESIGN.md, "Rows of up to 1024 keys: clusters").

Two models of a cluster of C CTAs walking heads of T row blocks of 64 rows (causal, Sq = Sk = 64 T):

balance: CTAs of 128 keys; row block t of head i is a block of every CTA whose key block kb (owner(i, r) for CTA
r) it sees (t >= 2 kb). Each CTA does its blocks one at a time in its own order (order(block, r)); a block's
statistics exchange makes its participants wait for the last of them to start it. Printed: the work over C times
the makespan (1: no CTA ever idle), or a deadlock where two CTAs meet their common blocks in different orders.

chunk_balance: CTAs holding 64-key chunks (chunks_of(r)), a block costing a CTA half a step per chunk of its that
the block sees (products of N = 64 where one is seen); each block in two phases, S with the partial statistics
(share a of its cost), then, once every participant has pushed its partial, dS and the products; a CTA may run
the first phase of up to `ahead` blocks past the block whose exchange it awaits (the pingpong's two consumers
give one). Printed: the same ratio, for run-ahead 0, 1, 2 and 4.

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


def chunk_balance(C, T, heads, chunks_of, order, a=0.4, ahead=1):
    seq = {r: [] for r in range(C)}
    parts, cost = {}, {}
    for i in range(heads):
        for t in range(T):
            for r in range(C):
                seen = sum(1 for c in chunks_of(r) if t >= c)
                if seen:
                    seq[r].append((i, t))
                    cost[((i, t), r)] = 0.5 * seen
                    parts.setdefault((i, t), []).append(r)
    for r in range(C):
        seq[r].sort(key=order)
    first = {r: 0 for r in range(C)}   # phases done: first (S, partial statistics) and second (dS, products)
    second = {r: 0 for r in range(C)}
    free = {r: 0.0 for r in range(C)}
    pushed = {}                        # (block, CTA): when its partial statistics were pushed
    left = 2 * sum(len(s) for s in seq.values())
    while left:
        best = None  # the earliest action of any CTA: a second phase whose partials are all in, else a first phase
        for r in range(C):
            if second[r] < first[r]:
                b = seq[r][second[r]]
                ends = [pushed.get((b, q)) for q in parts[b]]
                if all(e is not None for e in ends):
                    cand = (max([free[r]] + ends), 0, r, b)
                    best = cand if best is None or cand < best else best
            if first[r] < len(seq[r]) and first[r] - second[r] <= ahead:
                cand = (free[r], 1, r, seq[r][first[r]])
                best = cand if best is None or cand < best else best
        if best is None:
            return None
        start, phase, r, b = best
        if phase == 1:
            free[r] = start + a * cost[(b, r)]
            pushed[(b, r)] = free[r]
            first[r] += 1
        else:
            free[r] = start + (1 - a) * cost[(b, r)]
            second[r] += 1
        left -= 1
    return sum(cost.values()) / (C * max(free.values()))


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
    print("64-key chunks, run-ahead 0 / 1 / 2 / 4:")
    for C, T in ((2, 4), (4, 8), (8, 16)):
        def interleaved(b, T=T):  # the later half's row blocks alternated with the earlier half's: T/2, 0, T/2 + 1, 1, ...
            i, t = b
            return (i, 2 * (t - T // 2) if t >= T // 2 else 2 * t + 1)
        schedules = {"contiguous (chunks 2r, 2r + 1), row order": (lambda r: (2 * r, 2 * r + 1), lambda b: b),
                     "mirrored (chunks r, 2C - 1 - r), row order": (lambda r, C=C: (r, 2 * C - 1 - r), lambda b: b),
                     "mirrored, interleaved row order": (lambda r, C=C: (r, 2 * C - 1 - r), interleaved)}
        for name, (chunks_of, order) in schedules.items():
            values = [chunk_balance(C, T, heads // 2, chunks_of, order, ahead=k) for k in (0, 1, 2, 4)]
            print(f"C = {C}, S = {64 * T}: {name}: " +
                  " / ".join("deadlock" if v is None else f"{100 * v:.1f} %" for v in values))


if __name__ == "__main__":
    main()
