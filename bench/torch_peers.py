#!/usr/bin/env python3
"""PyTorch peers of qksoftmax, measured like qksoftmax-bench measures qksoftmax, merged into its JSON.

Impls (the PyTorch peers of docs/SPEC.md, section 6):
  torch_eager     mode saved_p:   dS = aten._softmax_backward_data(dP, P, -1, dtype) · scale, then two batched
                                  matmuls dQ = dS K, dK = dSᵀ Q (P is the softmax of the same Q, K).
  torch_compile   mode saved_p:   torch.compile of that chain.
  torch_autograd  mode recompute: torch.autograd.grad of the forward graph softmax(masked_fill(Q Kᵀ · scale))
                                  with respect to (Q, K), grad_outputs = dP; only the grad call is timed. Its
                                  inputs are recompute mode's (Q, K, dP); autograd keeps P from the forward
                                  graph rather than recomputing it, so it is the usual training-time peer of
                                  recompute mode.
End to end (mode forward_backward): the score block of a training step, forward then backward,
timed as one call — p from (Q, K), then torch.autograd.grad(p, (Q, K), grad_outputs=dP):
  torch_eager     the forward graph softmax(masked_fill(Q Kᵀ · scale)) and autograd through it;
  torch_compile   torch.compile of that forward (AOTAutograd compiles its backward too);
  qksoftmax_op    qksoftmax.attention_probs (fused forward, fused recompute backward: save="lse");
  qksoftmax_op_p  the same with save="p" (saved-P backward).
Its SOL time is the forward's plus recompute mode's (the least work of the pair).
Timing (as the CLI's): CUDA events between calls issued back to back, warm-ups first, median of the timed
calls, inputs rotated over k sets with k = max(2, 1 + ceil(3 · L2 / SOL bytes per call)) (1 when k sets do not
fit and one call moves ≥ 3 · L2). SOL time uses the same model and the ceilings found in the JSON (measured
here with torch if the JSON has none). Before timing, dQ and dK of head (B−1, H−1) of the first set are
compared with an fp64 computation (the accuracy bar of tests/common/accuracy.h; NaN fails); a failing case reports no time.
Outputs are fresh tensors, so there is nothing to poison.

    python3 bench/torch_peers.py --json bench/results/h200.json --suite seed16 [--dtype bf16]

Runs already in the JSON with the same (suite, mode, dtype, impl) are replaced; the others are kept.
Exit status: 0, or 1 when a case failed its check or met an error (out of memory is reported, not fatal).
"""
import argparse
import datetime
import json
import math
import re
import statistics
import sys
from pathlib import Path

import torch

SUITES = {
    "seed16": [(b, 128, s, 128) for b in (1, 2, 4, 8) for s in (128, 256, 512, 1024)],
    "long": [(1, 16, s, 128) for s in (2048, 4096, 8192, 16384, 32768)],
}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# The accuracy bar of the C++ bench and the tests (tests/common/accuracy.h), by the bench's dtype names.
_ACCURACY = dict(re.findall(r'\{DType::k\w+, "(\w+)", ([0-9.e+-]+)\}',
                            (Path(__file__).resolve().parents[1] / "tests" / "common" / "accuracy.h").read_text()))
THRESHOLDS = {short: float(_ACCURACY[name]) for short, name in
              {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}.items()}
IMPLS = {"eager": ("torch_eager", "saved_p"), "compile": ("torch_compile", "saved_p"),
         "autograd": ("torch_autograd", "recompute"),
         "eager_fwd": ("torch_eager", "forward"), "compile_fwd": ("torch_compile", "forward"),
         "eager_fwd_bwd": ("torch_eager", "forward_backward"), "compile_fwd_bwd": ("torch_compile", "forward_backward"),
         "qksoftmax_fwd_bwd": ("qksoftmax_op", "forward_backward"),
         "qksoftmax_p_fwd_bwd": ("qksoftmax_op_p", "forward_backward")}
FWD_BWD = "forward_backward"
LSE_BYTES_PER_ROW = 4
L2_MULTIPLE = 3
MIN_COPIES, MAX_COPIES = 2, 1024
MEMORY_RESERVE = 2 << 30
COPY_BYTES = 2 << 30
GEMM_SIZE = 8192
CEILING_WARMUP, CEILING_RUNS = 5, 20
DEFAULT_RUNS, MIN_RUNS = 30, 20
DEFAULT_WARMUP, MIN_WARMUP = 5, 3
SEED = 0x5EED


# ---- the SOL model (docs/SPEC.md, section 6), as bench/model.cpp ----------------------------------------

def live_elements(B, H, S, causal):
    return B * H * (S * (S + 1) // 2 if causal else S * S)


def sol_cost(shape, mode, dtype, causal):
    B, H, S, D = shape
    e = torch.tensor([], dtype=DTYPES[dtype]).element_size()
    live = live_elements(B, H, S, causal)
    qk = B * H * S * D * e
    gemm = 2 * D * live
    if mode == "saved_p":
        return 2 * live * e + 4 * qk, 2 * gemm
    if mode == "recompute":
        return live * e + 4 * qk, 3 * gemm
    if mode == "forward":
        return B * H * S * S * e + 2 * qk + B * H * S * LSE_BYTES_PER_ROW, gemm
    if mode == FWD_BWD:  # two parts, each with its own bound: their SOL times add (sol_us)
        return sol_cost(shape, "forward", dtype, causal), sol_cost(shape, "recompute", dtype, causal)
    raise ValueError(mode)


def sol_us(cost, dtype, ceilings):
    if isinstance(cost[0], tuple):
        return sum(sol_us(part, dtype, ceilings) for part in cost)
    bytes_, flops = cost
    rate = {"bf16": ceilings["bf16_TFLOPs"], "fp16": ceilings["fp16_TFLOPs"], "fp32": ceilings["tf32_TFLOPs"]}[dtype]
    return max(bytes_ / (ceilings["copy_GBps"] * 1e9), flops / (rate * 1e12)) * 1e6


def total_cost(cost):
    """(bytes, flops) of a cost, its parts summed."""
    if isinstance(cost[0], tuple):
        return tuple(sum(part[i] for part in cost) for i in range(2))
    return cost


# ---- timing -------------------------------------------------------------------------------------------------

def time_calls(call, sets, warmup, runs):
    """Median µs of `runs` calls issued back to back with an event between consecutive ones."""
    for i in range(warmup):
        call(sets[i % len(sets)])
    events = [torch.cuda.Event(enable_timing=True) for _ in range(runs + 1)]
    events[0].record()
    for i in range(runs):
        call(sets[(warmup + i) % len(sets)])
        events[i + 1].record()
    events[-1].synchronize()
    return statistics.median(events[i].elapsed_time(events[i + 1]) * 1e3 for i in range(runs))


def measure_ceilings():
    src = torch.ones(COPY_BYTES, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy_us = time_calls(lambda _: dst.copy_(src), [None], CEILING_WARMUP, CEILING_RUNS)
    flops = 2 * GEMM_SIZE ** 3

    def gemm_tflops(dtype, tf32):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        a = torch.randn(GEMM_SIZE, GEMM_SIZE, device="cuda", dtype=dtype)
        b = torch.randn(GEMM_SIZE, GEMM_SIZE, device="cuda", dtype=dtype)
        us = time_calls(lambda _: a @ b, [None], CEILING_WARMUP, CEILING_RUNS)
        torch.backends.cuda.matmul.allow_tf32 = False
        return flops / (us * 1e-6) / 1e12

    return {"copy_GBps": 2 * COPY_BYTES / (copy_us * 1e-6) / 1e9,
            "bf16_TFLOPs": gemm_tflops(torch.bfloat16, False), "fp16_TFLOPs": gemm_tflops(torch.float16, False),
            "tf32_TFLOPs": gemm_tflops(torch.float32, True), "fp32_TFLOPs": gemm_tflops(torch.float32, False)}


def plan_copies(per_call_bytes, set_bytes, extra_bytes):
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    wanted = min(MAX_COPIES, max(MIN_COPIES, 1 + math.ceil(L2_MULTIPLE * l2 / per_call_bytes)))
    free, _ = torch.cuda.mem_get_info()
    usable = free - MEMORY_RESERVE
    if wanted * set_bytes + extra_bytes <= usable:
        return wanted
    if per_call_bytes >= L2_MULTIPLE * l2 and set_bytes + extra_bytes <= usable:
        return 1
    raise torch.cuda.OutOfMemoryError(f"{wanted} sets of {set_bytes / 2**30:.1f} GiB do not fit")


# ---- the peers ------------------------------------------------------------------------------------------------

def masked_probabilities(q, k, scale, mask):
    scores = (q @ k.transpose(-1, -2)) * scale
    if mask is not None:
        scores = scores.masked_fill(mask, float("-inf"))
    return torch.softmax(scores, dim=-1)


def saved_p_chain(p, dp, q, k, scale):
    ds = torch.ops.aten._softmax_backward_data(dp, p, -1, p.dtype) * scale
    return ds @ k, ds.transpose(-1, -2) @ q


def forward_backward(forward, q, k, dp):
    """The score block of a training step: p = forward(q, k), then the gradients of (q, k) for dp."""
    return torch.autograd.grad(forward(q, k), (q, k), grad_outputs=dp)


def fwd_bwd_forward(impl, scale, mask):
    """The forward of an end-to-end impl, as a function of (q, k)."""
    if impl in ("qksoftmax_op", "qksoftmax_op_p"):
        import qksoftmax  # only here: the other peers need no build of the library

        save = "p" if impl == "qksoftmax_op_p" else "lse"
        return lambda q, k: qksoftmax.attention_probs(q, k, scale=scale, causal=mask is not None, save=save)
    forward = lambda q, k: masked_probabilities(q, k, scale, mask)  # noqa: E731
    if impl == "torch_compile":
        torch._dynamo.reset()
        return torch.compile(forward, dynamic=False)
    return forward


class Case:
    """The inputs of one case (k rotation sets) and the call of one peer on a set."""

    def __init__(self, impl, mode, shape, dtype, causal, copies, generator):
        B, H, S, D = shape
        self.impl, self.mode, self.scale = impl, mode, 1.0 / math.sqrt(D)
        self.mask = torch.ones(S, S, dtype=torch.bool, device="cuda").triu(1) if causal else None
        self.compiled = None
        self.forward = fwd_bwd_forward(impl, self.scale, self.mask) if mode in (FWD_BWD, "forward") else None
        if self.forward is None and impl == "torch_compile":
            torch._dynamo.reset()
            self.compiled = torch.compile(saved_p_chain, dynamic=False)
        self.sets = []
        for _ in range(copies):
            def randn(*size):
                return torch.randn(*size, device="cuda", dtype=DTYPES[dtype], generator=generator)

            q, k, dp = randn(B, H, S, D), randn(B, H, S, D), randn(B, H, S, S)
            if mode == "forward":  # P from (q, k): no gradient, no dP
                self.sets.append((q, k, None, None))
                continue
            if self.forward is not None:
                self.sets.append((q.requires_grad_(True), k.requires_grad_(True), dp, None))
                continue
            if impl == "torch_autograd":
                q.requires_grad_(True)
                k.requires_grad_(True)
                self.sets.append((q, k, dp, masked_probabilities(q, k, self.scale, self.mask)))
                continue
            p = torch.empty_like(dp)
            with torch.no_grad():
                for b in range(B):  # a head at a time: the dense temporaries stay small
                    for h in range(H):
                        p[b, h] = masked_probabilities(q[b, h], k[b, h], self.scale, self.mask)
            self.sets.append((q, k, dp, p))

    def call(self, s):
        q, k, dp, p = s
        if self.mode == "forward":
            with torch.no_grad():
                return (self.forward(q, k),)
        if self.forward is not None:
            return forward_backward(self.forward, q, k, dp)
        if self.impl == "torch_autograd":
            return torch.autograd.grad(p, (q, k), grad_outputs=dp, retain_graph=True)
        with torch.no_grad():
            return (self.compiled or saved_p_chain)(p, dp, q, k, self.scale)

    def errors(self):
        """Relative Frobenius errors of dQ, dK (forward: P) of head (B−1, H−1) of set 0 against fp64."""
        q, k, dp, p = self.sets[0]
        if self.mode == "forward":  # P of head (B−1, H−1) against fp64
            (out,) = self.call(self.sets[0])
            with torch.no_grad():
                ref = masked_probabilities(q[-1, -1].double(), k[-1, -1].double(), self.scale, self.mask)
                return {"P": ((out[-1, -1].double() - ref).norm() / ref.norm()).item()}
        dq, dk = self.call(self.sets[0])
        with torch.no_grad():
            q64, k64, dp64 = (t[-1, -1].double() for t in (q, k, dp))
            p64 = (masked_probabilities(q64, k64, self.scale, self.mask) if p is None or self.impl == "torch_autograd"
                   else p[-1, -1].double())
            ref_dq, ref_dk = saved_p_chain(p64, dp64, q64, k64, self.scale)
            return {name: ((out[-1, -1].double() - ref).norm() / ref.norm()).item()
                    for name, out, ref in (("dQ", dq, ref_dq), ("dK", dk, ref_dk))}


def run_case(impl, mode, shape, dtype, causal, args, ceilings, generator):
    cost = sol_cost(shape, mode, dtype, causal)
    bytes_, flops = total_cost(cost)
    entry = dict(zip("BHSD", shape))
    entry.update(us=None, sol_us=sol_us(cost, dtype, ceilings), sol_pct=None, bytes=bytes_, flops=flops,
                 copies=0, err={}, error=None)
    B, H, S, D = shape
    e = torch.tensor([], dtype=DTYPES[dtype]).element_size()
    dense = B * H * S * S * e
    try:
        entry["copies"] = plan_copies(bytes_, 2 * dense + 2 * B * H * S * D * e, 3 * dense)
        case = Case(impl, mode, shape, dtype, causal, entry["copies"], generator)
        entry["err"] = case.errors()
        bad = [f"{n} {v:.2e} > {THRESHOLDS[dtype]:.2e}" for n, v in entry["err"].items()
               if not v <= THRESHOLDS[dtype]]
        if bad:
            entry["error"] = "FAILED: " + ", ".join(bad)
            return entry
        entry["us"] = time_calls(case.call, case.sets, args.warmup, args.runs)
        entry["sol_pct"] = 100.0 * entry["sol_us"] / entry["us"]
    except torch.cuda.OutOfMemoryError as e:
        entry["error"] = f"out of memory: {str(e).splitlines()[0]}"
    except Exception as e:  # noqa: BLE001  (a peer that breaks is reported, the others still run)
        entry["error"] = f"error: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    finally:
        torch.cuda.empty_cache()
    return entry


# ---- output -------------------------------------------------------------------------------------------------

def aggregate(cases):
    if not cases or any(c["us"] is None for c in cases):
        return None, None
    total = sum(c["us"] for c in cases)
    return total / len(cases), 100.0 * sum(c["sol_us"] for c in cases) / total


def print_run(run):
    print(f"\n== {run['suite']} | {run['mode']} | {run['dtype']} | {run['impl']} ==")
    print(f"{'B':>4} {'H':>5} {'S':>6} {'D':>4} {'us':>10} {'TFLOP/s':>8} {'GB/s':>8} {'SOL us':>9} {'%SOL':>7} "
          f"{'copies':>6}  check (rel. error)")
    for c in run["cases"]:
        head = f"{c['B']:>4} {c['H']:>5} {c['S']:>6} {c['D']:>4}"
        if c["us"] is None:
            print(f"{head}  {c['error']}")
            continue
        seconds = c["us"] * 1e-6
        errs = " ".join(f"{n} {v:.1e}" for n, v in c["err"].items())
        print(f"{head} {c['us']:>10.1f} {c['flops'] / seconds / 1e12:>8.1f} {c['bytes'] / seconds / 1e9:>8.0f} "
              f"{c['sol_us']:>9.1f} {c['sol_pct']:>6.1f}% {c['copies']:>6}  {errs}")
    if run["mean_us"] is None:
        print("suite: incomplete (a case has no time): no aggregate")
    else:
        print(f"suite: %SOL {run['sol_pct']:.1f}%, mean {run['mean_us']:.1f} us")
    sys.stdout.flush()


def load_report(path):
    if path.exists():
        report = json.loads(path.read_text())
        ceilings = report.get("ceilings") or {}
        if all(isinstance(ceilings.get(k), (int, float)) for k in ("copy_GBps", "bf16_TFLOPs", "fp16_TFLOPs",
                                                                   "tf32_TFLOPs")):
            return report
    else:
        report = {"gpu": torch.cuda.get_device_name(0),
                  "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), "runs": []}
    print("torch_peers.py: no ceilings in the JSON: measuring them with torch", file=sys.stderr)
    report["ceilings"] = measure_ceilings()
    return report


def parse_shape(text):
    fields = tuple(int(x) for x in text.split(","))
    if len(fields) != 4 or min(fields) < 1:
        raise argparse.ArgumentTypeError(f"--case wants B,H,S,D (four integers >= 1), got '{text}'")
    return fields


def at_least(minimum):
    def parse(text):
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"wants an integer >= {minimum}, got {text}")
        return value
    return parse


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, default=Path(__file__).resolve().parent / "results" / "latest.json")
    parser.add_argument("--suite", choices=["seed16", "long", "all"], default="seed16")
    parser.add_argument("--case", type=parse_shape, action="append", help="B,H,S,D instead of a suite")
    parser.add_argument("--dtype", choices=[*DTYPES, "all"], default="bf16")
    parser.add_argument("--impl", default="eager,compile,autograd", help="comma list of eager, compile, autograd")
    parser.add_argument("--runs", type=at_least(MIN_RUNS), default=DEFAULT_RUNS)
    parser.add_argument("--warmup", type=at_least(MIN_WARMUP), default=DEFAULT_WARMUP)
    parser.add_argument("--no-mask", action="store_true")
    args = parser.parse_args(argv)
    impls = args.impl.split(",")
    if any(i not in IMPLS for i in impls):
        parser.error(f"--impl wants a comma list of {', '.join(IMPLS)}, got '{args.impl}'")
    if not torch.cuda.is_available():
        print("torch_peers.py: no CUDA GPU visible to torch: nothing to measure", file=sys.stderr)
        return 1

    report = load_report(args.json)
    ceilings = report["ceilings"]
    suites = {"custom": args.case} if args.case else (SUITES if args.suite == "all" else {args.suite: SUITES[args.suite]})
    dtypes = list(DTYPES) if args.dtype == "all" else [args.dtype]
    causal = not args.no_mask
    generator = torch.Generator(device="cuda").manual_seed(SEED)
    total = sum(len(shapes) for shapes in suites.values()) * len(dtypes) * len(impls)
    done, failed = 0, False
    for suite, shapes in suites.items():
        for dtype in dtypes:
            for key in impls:
                impl, mode = IMPLS[key]
                cases = []
                for shape in shapes:
                    done += 1
                    print(f"[{done}/{total}] {suite} {mode} {dtype} {impl} B={shape[0]} H={shape[1]} S={shape[2]} "
                          f"D={shape[3]}", file=sys.stderr, flush=True)
                    cases.append(run_case(impl, mode, shape, dtype, causal, args, ceilings, generator))
                    error = cases[-1]["error"]
                    failed |= error is not None and not error.startswith("out of memory")
                mean_us, pct = aggregate(cases)
                run = {"suite": suite, "mode": mode, "dtype": dtype, "impl": impl, "mean_us": mean_us,
                       "sol_pct": pct, "cases": cases, "mask": "causal" if causal else "none",
                       "torch": torch.__version__}
                print_run(run)
                report["runs"] = [r for r in report.get("runs", []) if (r["suite"], r["mode"], r["dtype"], r["impl"])
                                  != (suite, mode, dtype, impl)] + [run]
                args.json.parent.mkdir(parents=True, exist_ok=True)
                args.json.write_text(json.dumps(report, indent=1) + "\n")
    print(f"\nresults: {args.json}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
