"""One data-parallel training step of a small attention model whose scores come from qksoftmax.attention_probs:
torch.distributed with NCCL, DistributedDataParallel, one process per GPU, each on its share of the batch. It is
checked against the same step on one GPU with the whole batch: the loss, every parameter's gradient after DDP's
all-reduce, and every parameter after the optimizer's step agree within bf16's tolerance.

    PYTHONPATH=python python3 examples/ddp_step.py                      # every visible GPU (two at least)
    PYTHONPATH=python python3 examples/ddp_step.py --gpus 2 --batch 8 --seq 512 --json ddp.json

NVLink multicast stays off (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1, set
here for every process). The processes rendezvous through a file, not a port. Exit status 0 when everything
agrees, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time

# Before torch.distributed and NCCL start, in this process and in those it spawns.
os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

import qksoftmax  # noqa: E402

BF16_TOLERANCE = 1e-2  # relative Frobenius error, the accuracy bar of bf16
MLP_RATIO = 4
LEARNING_RATE = 1e-3


class Block(nn.Module):
    """Pre-norm causal GQA attention (scores by qksoftmax.attention_probs) and an MLP."""

    def __init__(self, width: int, heads: int, kv_heads: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, width // heads
        self.norm = nn.LayerNorm(width)
        self.q = nn.Linear(width, width, bias=False)
        self.kv = nn.Linear(width, 2 * kv_heads * self.head_dim, bias=False)
        self.out = nn.Linear(width, width, bias=False)
        self.mlp_norm = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, MLP_RATIO * width), nn.GELU(), nn.Linear(MLP_RATIO * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        h = self.norm(x)
        q = self.q(h).view(batch, seq, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(h).view(batch, seq, 2 * self.kv_heads, self.head_dim).transpose(1, 2).chunk(2, dim=1)
        p = qksoftmax.attention_probs(q, k, causal=True)  # (B, heads, S, S), k with kv_heads heads
        group = self.heads // self.kv_heads
        # Query head h reads key head h // group: P of a key head's group times its V, V never repeated.
        attended = (p.reshape(batch, self.kv_heads, group * seq, seq) @ v).reshape(batch, self.heads, seq, -1)
        x = x + self.out(attended.transpose(1, 2).reshape(batch, seq, -1))
        return x + self.mlp(self.mlp_norm(x))


def make_model(args: argparse.Namespace, device: torch.device) -> nn.Module:
    torch.manual_seed(args.seed)
    return Block(args.width, args.heads, args.kv_heads).to(device)


def make_data(args: argparse.Namespace, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(args.seed + 1)
    x, target = torch.randn(2, args.batch, args.seq, args.width, generator=generator)
    return x.to(device), target.to(device)


def train_step(model: nn.Module, x: torch.Tensor, target: torch.Tensor) -> tuple[float, torch.optim.Optimizer]:
    """Forward in bf16 autocast, mean-squared-error loss, backward, one SGD step; returns the loss."""
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = nn.functional.mse_loss(model(x).float(), target)
    loss.backward()
    return loss.detach(), optimizer


def relative_error(value: torch.Tensor, reference: torch.Tensor) -> float:
    reference = reference.double()
    return float((value.double() - reference).norm() / (reference.norm() or 1.0))


def worker(rank: int, world: int, rendezvous: str, args: argparse.Namespace, results: str) -> None:
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    dist.init_process_group("nccl", init_method=f"file://{rendezvous}", rank=rank, world_size=world,
                            device_id=device)
    x, target = make_data(args, device)
    share = args.batch // world
    model = DistributedDataParallel(make_model(args, device), device_ids=[rank])
    torch.cuda.synchronize()
    start = time.perf_counter()
    loss, optimizer = train_step(model, x[rank * share:(rank + 1) * share], target[rank * share:(rank + 1) * share])
    gradients = {name: p.grad.detach().clone() for name, p in model.module.named_parameters()}
    optimizer.step()
    torch.cuda.synchronize()
    step_ms = (time.perf_counter() - start) * 1e3
    dist.all_reduce(loss)
    loss = float(loss) / world
    if rank == 0:
        reference = make_model(args, device)
        reference_loss, reference_optimizer = train_step(reference, x, target)
        reference_gradients = {name: p.grad for name, p in reference.named_parameters()}
        reference_optimizer.step()
        gradient_errors = {name: relative_error(gradients[name], reference_gradients[name]) for name in gradients}
        parameters = dict(model.module.named_parameters())
        parameter_errors = {name: relative_error(parameters[name].detach(), p.detach())
                            for name, p in reference.named_parameters()}
        loss_error = abs(loss - float(reference_loss)) / abs(float(reference_loss))
        worst_gradient = max(gradient_errors.values())
        summary = {
            "gpus": world,
            "gpu": torch.cuda.get_device_name(device),
            "torch": torch.__version__,
            "config": vars(args),
            "loss": loss,
            "loss_one_gpu": float(reference_loss),
            "loss_relative_error": loss_error,
            "gradient_relative_errors": gradient_errors,
            "worst_gradient_relative_error": worst_gradient,
            "worst_parameter_relative_error": max(parameter_errors.values()),
            "tolerance": BF16_TOLERANCE,
            "step_ms_rank0": step_ms,
            "ok": all(math.isfinite(e) and e <= BF16_TOLERANCE
                      for e in [loss_error, worst_gradient, *parameter_errors.values()]),
        }
        with open(results, "w") as file:
            json.dump(summary, file, indent=1)
    dist.barrier()
    dist.destroy_process_group()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=0, help="processes, one per GPU (0: every visible GPU)")
    parser.add_argument("--batch", type=int, default=8, help="the whole batch, split evenly over the GPUs")
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the figures to this file")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    world = args.gpus or torch.cuda.device_count()
    if world < 2 or torch.cuda.device_count() < world:
        raise SystemExit(f"needs {max(world, 2)} CUDA devices, found {torch.cuda.device_count()}")
    if args.batch % world:
        raise SystemExit(f"--batch {args.batch} does not split evenly over {world} GPUs")
    with tempfile.TemporaryDirectory() as folder:
        rendezvous, results = os.path.join(folder, "rendezvous"), os.path.join(folder, "results.json")
        mp.spawn(worker, args=(world, rendezvous, args, results), nprocs=world, join=True)
        with open(results) as file:
            summary = json.load(file)
    print(f"DDP step on {world} GPUs ({summary['gpu']}), batch {args.batch} x seq {args.seq}, width {args.width}, "
          f"heads {args.heads}/{args.kv_heads}: loss {summary['loss']:.6f} (one GPU {summary['loss_one_gpu']:.6f}); "
          f"worst gradient relative error {summary['worst_gradient_relative_error']:.2e}, worst parameter after "
          f"the step {summary['worst_parameter_relative_error']:.2e} (bound {BF16_TOLERANCE:g}): "
          f"{'ok' if summary['ok'] else 'MISMATCH'}")
    if args.json:
        with open(args.json, "w") as file:
            json.dump(summary, file, indent=1)
    return summary


if __name__ == "__main__":
    sys.exit(0 if main()["ok"] else 1)
