"""Host time per call of each layer of the torch path, beside PyTorch's own ops in the same run: where a small
call's time goes on this machine's CPU (docs/PYTORCH.md, "Host time").

    PYTHONPATH=python python3 bench/host_time.py [--device cuda] [--calls 2000] [--repeats 5] [--json FILE]

The shape is tiny (B = H = 1, S = 128, D = 128, bf16 on CUDA): its kernels take a few µs, less than the host
spends per call, so calls back to back without synchronising measure the host. Each line is the median over
`repeats` rounds of `calls` calls (host µs per call); the rounds run layer after layer, in turns, so that a
drift of the machine spreads over every layer. Layers from the bottom: the C++ calls (qksoftmax._C: a plan,
its run, and the one call per operation that the torch path makes: outputs, plan, workspace, run), the eager
fast path's Python layer (_ops.eager_forward / eager_backward: that call, the checks only on a refusal), the
custom ops (torch.ops.qksoftmax), the public functions, attention_probs forward + autograd.grad on the eager
fast path and through the ops, and its forward where autograd records nothing; then PyTorch's reference
ops, among them the floor of any op built as an autograd.Function (outputs allocated, nothing computed) and
two native ops whose autograd is C++ (softmax of a P-shaped tensor, and q @ kᵀ, each forward +
autograd.grad, as attention_probs is timed): what forward + backward costs on this host for an op with no
Python in its autograd, the least any op reached through autograd.grad can cost.
--json writes the figures as a results file (bench/results/h200-host.json).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

import qksoftmax
from qksoftmax import _C, _frames, _ops
from results_file import write_results

SHAPE = (1, 1, 128, 128)  # (B, H, S, D)
CPU_SHAPE = (1, 1, 16, 16)  # the CPU backend computes in fp64 on the host: keep its work small
WARMUP_CALLS = 50
# The figures the call path is held to (host µs per call on the GPU machine).
GOALS_US = {"qksoftmax.forward": 20, "qksoftmax.backward (recompute, lse)": 20,
            "attention_probs fwd+bwd (eager fast path)": 80}


def host_us(call: Callable[[], object], calls: int) -> float:
    """Host µs per call over `calls` calls back to back (the caller synchronises before)."""
    start = time.perf_counter()
    for _ in range(calls):
        call()
    return (time.perf_counter() - start) / calls * 1e6


def layers(device: str) -> tuple[dict[str, Callable[[], object]], dict[str, Callable[[], object]], tuple[int, ...]]:
    """The calls to time: qksoftmax's layers, and PyTorch's reference ops; and the shape."""
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    shape = SHAPE if device == "cuda" else CPU_SHAPE
    B, H, S, D = shape
    generator = torch.Generator(device=device).manual_seed(0)

    def randn(*size: int) -> torch.Tensor:
        return torch.randn(*size, device=device, dtype=dtype, generator=generator)

    q, k, dp = randn(B, H, S, D), randn(B, H, S, D), randn(B, H, S, S)
    scores = randn(B, H, S, S).requires_grad_(True)
    p, lse = qksoftmax.forward(q, k)
    dq, dk = torch.empty_like(q), torch.empty_like(k)
    qg, kg = q.clone().requires_grad_(True), k.clone().requires_grad_(True)
    mask = torch.ones(S, S, dtype=torch.bool, device=device).triu(1)
    stream = torch.cuda.current_stream(q.device).cuda_stream if device == "cuda" else 0
    forward_plan = _C.plan_forward(q, k, p, lse, None, True)
    backward_plan = _C.plan_backward(q, k, dp, None, lse, dq, dk, None, True)
    workspace = torch.empty(backward_plan.workspace_bytes + _C.WORKSPACE_ALIGNMENT, dtype=torch.uint8, device=device)
    workspace_address = _frames.aligned_address(workspace.data_ptr())

    def grad(out: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.autograd.grad(out, (qg, kg), grad_outputs=dp)

    def through_ops() -> tuple[torch.Tensor, ...]:
        p, _ = torch.ops.qksoftmax.forward(qg, kg, None, True, "lse")
        return grad(p)

    class Floor(torch.autograd.Function):
        """What any autograd.Function op costs here: outputs allocated, q and k saved, no work."""

        @staticmethod
        def forward(ctx, q, k):
            ctx.save_for_backward(q, k)
            return q.new_empty(q.shape[:-1] + (k.shape[-2],))

        @staticmethod
        def backward(ctx, grad_p):
            q, k = ctx.saved_tensors
            return torch.empty_like(q), torch.empty_like(k)

    def torch_block() -> torch.Tensor:
        return torch.softmax((qg @ kg.transpose(-1, -2) * D**-0.5).masked_fill(mask, float("-inf")), -1)

    ours = {
        "_C.plan_forward": lambda: _C.plan_forward(q, k, p, lse, None, True),
        "Plan.run (forward)": lambda: forward_plan.run(0, 0, stream),
        "_C.plan_backward (recompute, lse)": lambda: _C.plan_backward(q, k, dp, None, lse, dq, dk, None, True),
        "Plan.run (backward)": lambda: backward_plan.run(workspace_address, backward_plan.workspace_bytes, stream),
        "_C.torch_forward": lambda: _C.torch_forward(q, k, None, True),
        "_C.torch_backward (recompute, lse)": lambda: _C.torch_backward(q, k, dp, None, lse, None, True),
        "_ops.eager_forward": lambda: _ops.eager_forward("x", q, k, None, True),
        "_ops.eager_backward (recompute, lse)": lambda: _ops.eager_backward("x", q, k, dp, None, lse, None, True),
        "torch.ops.qksoftmax.forward": lambda: torch.ops.qksoftmax.forward(q, k, None, True, "lse"),
        "torch.ops.qksoftmax.backward_recompute": lambda: torch.ops.qksoftmax.backward_recompute(
            q, k, dp, lse, None, True),
        "qksoftmax.forward": lambda: qksoftmax.forward(q, k),
        "qksoftmax.backward (recompute, lse)": lambda: qksoftmax.backward(q, k, dp, lse=lse),
        "qksoftmax.backward (recompute)": lambda: qksoftmax.backward(q, k, dp),
        "qksoftmax.backward (saved_p)": lambda: qksoftmax.backward(q, k, dp, p=p),
        "attention_probs fwd+bwd (eager fast path)": lambda: grad(qksoftmax.attention_probs(qg, kg)),
        "attention_probs fwd+bwd (through the ops)": through_ops,
        "attention_probs fwd (nothing recorded)": lambda: qksoftmax.attention_probs(q, k),
    }
    reference = {
        "torch: one matmul": lambda: q @ k.transpose(-1, -2),
        "torch: _softmax_backward_data + one matmul": lambda: torch.ops.aten._softmax_backward_data(
            dp, p, -1, dtype) @ k,
        "torch: score block fwd+bwd (eager)": lambda: grad(torch_block()),
        "torch: autograd.Function floor fwd+bwd (allocations only)": lambda: grad(Floor.apply(qg, kg)),
        # Native ops, autograd in C++: forward + autograd.grad as attention_probs (no Python in the graph).
        "torch: softmax fwd+bwd (C++ autograd)": lambda: torch.autograd.grad(
            torch.softmax(scores, -1), scores, grad_outputs=dp),
        "torch: q @ k^T fwd+bwd (C++ autograd)": lambda: grad(qg @ kg.transpose(-1, -2)),
    }
    return ours, reference, shape


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", help="write the figures to this results file")
    args = parser.parse_args()
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    ours, reference, shape = layers(args.device)
    calls = {**ours, **reference}
    for call in calls.values():
        for _ in range(WARMUP_CALLS):
            call()
    sync()
    rounds: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(args.repeats):
        for name, call in calls.items():
            rounds[name].append(host_us(call, args.calls))
            sync()

    gpu = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    print(f"{gpu}, torch {torch.__version__}, qksoftmax {qksoftmax.__version__}, (B, H, S, D) = {shape}, "
          f"median of {args.repeats} x {args.calls} calls, host µs per call")
    runs = []
    for name, values in rounds.items():
        median = statistics.median(values)
        goal = GOALS_US.get(name)
        mark = f"   goal <= {goal} µs: {'met' if median <= goal else 'NOT met'}" if goal else ""
        print(f"{name:46} {median:8.1f}   (min {min(values):.1f}, max {max(values):.1f}){mark}", flush=True)
        run = {"call": name, "us": median, "us_rounds": values, "reference": name in reference}
        if goal:
            run["goal_us"] = goal
        runs.append(run)
    if args.json:
        write_results(args.json, gpu, runs, shape=dict(zip("BHSD", shape)),
                      dtype="bf16" if args.device == "cuda" else "fp32", calls_per_round=args.calls,
                      rounds=args.repeats)


if __name__ == "__main__":
    main()
