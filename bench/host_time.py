"""Host time per call of each layer of the torch path, at a shape whose kernels take ~50 µs (docs/PYTORCH.md,
"Host time"): where a small call's time goes on this machine's CPU.

    PYTHONPATH=python python3 bench/host_time.py [--device cuda] [--calls 300]

Each line times `calls` calls back to back without synchronising (host µs per call), then the same with a
synchronisation after each call. Layers from the bottom: the C++ calls (qksoftmax._C, tensors as DLPack),
the Python layer around them (run_forward / run_backward), the custom ops (torch.ops.qksoftmax), the public
functions, and attention_probs forward + autograd.grad on the eager fast path and through the ops, beside
torch's own score block. The host is noisy: compare lines of one run only.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

import qksoftmax
from qksoftmax import _C, _core, _frames, _ops

SHAPE = (1, 128, 128, 128)  # (B, H, S, D): seed16's smallest case


def time_call(name: str, call: Callable[[], object], calls: int, device: str) -> None:
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for _ in range(20):
        call()
    sync()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    host = (time.perf_counter() - start) / calls * 1e6
    sync()
    start = time.perf_counter()
    for _ in range(calls // 4):
        call()
        sync()
    synced = (time.perf_counter() - start) / (calls // 4) * 1e6
    print(f"{name:44} host {host:8.1f} µs   synchronised {synced:8.1f} µs", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args()
    device, calls = args.device, args.calls
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    B, H, S, D = SHAPE if device == "cuda" else (1, 4, 32, 16)
    generator = torch.Generator(device=device).manual_seed(0)

    def randn(*size: int) -> torch.Tensor:
        return torch.randn(*size, device=device, dtype=dtype, generator=generator)

    q, k, dp = randn(B, H, S, D), randn(B, H, S, D), randn(B, H, S, S)
    p, lse = qksoftmax.forward(q, k)
    dq, dk = torch.empty_like(q), torch.empty_like(k)
    frame = _frames.TorchFrame("host_time", q)
    stream = torch.cuda.current_stream().cuda_stream if device == "cuda" else _frames.NO_STREAM
    qg, kg = q.clone().requires_grad_(True), k.clone().requires_grad_(True)
    mask = torch.ones(S, S, dtype=torch.bool, device=device).triu(1)

    def grad(out: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.autograd.grad(out, (qg, kg), grad_outputs=dp)

    def torch_block() -> torch.Tensor:
        return torch.softmax((qg @ kg.transpose(-1, -2) * D**-0.5).masked_fill(mask, float("-inf")), -1)

    print(f"{torch.cuda.get_device_name(0) if device == 'cuda' else 'CPU'}, torch {torch.__version__}, "
          f"(B, H, S, D) = {(B, H, S, D)}, {dtype}, {calls} calls")
    time_call("q.__dlpack__()", q.__dlpack__, calls, device)
    time_call("TorchFrame", lambda: _frames.TorchFrame("x", q), calls, device)
    time_call("_C.forward", lambda: _C.forward(q, k, p, lse, frame.workspace, None, True, stream), calls, device)
    time_call("_C.backward (recompute, lse)",
              lambda: _C.backward(q, k, dp, None, lse, dq, dk, frame.workspace, None, True, stream), calls, device)
    time_call("run_forward", lambda: _core.run_forward(_frames.TorchFrame("x", q), q, k, None, True), calls, device)
    time_call("run_backward", lambda: _core.run_backward(_frames.TorchFrame("x", q), q, k, dp, None, lse, None, True),
              calls, device)
    time_call("torch.ops.qksoftmax.forward", lambda: torch.ops.qksoftmax.forward(q, k, None, True, "lse"),
              calls, device)
    time_call("torch.ops.qksoftmax.backward_recompute",
              lambda: torch.ops.qksoftmax.backward_recompute(q, k, dp, lse, None, True), calls, device)
    time_call("qksoftmax.forward", lambda: qksoftmax.forward(q, k), calls, device)
    time_call("qksoftmax.backward", lambda: qksoftmax.backward(q, k, dp, lse=lse), calls, device)
    fast = _ops.plain_eager
    time_call("attention_probs fwd+bwd (eager fast path)", lambda: grad(qksoftmax.attention_probs(qg, kg)),
              calls, device)
    _ops.plain_eager = lambda *tensors: False
    try:
        time_call("attention_probs fwd+bwd (through the ops)", lambda: grad(qksoftmax.attention_probs(qg, kg)),
                  calls, device)
    finally:
        _ops.plain_eager = fast
    time_call("torch score block fwd+bwd (eager)", lambda: grad(torch_block()), calls, device)


if __name__ == "__main__":
    main()
