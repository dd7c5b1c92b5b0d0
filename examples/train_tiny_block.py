"""Trains a tiny transformer block whose attention scores come from qksoftmax.attention_probs.

    PYTHONPATH=python python3 examples/train_tiny_block.py             # on CUDA when present, else the CPU
    PYTHONPATH=python python3 examples/train_tiny_block.py --help      # every setting of Config

The block (pre-norm, one causal GQA attention layer, an MLP) is compiled with torch.compile(fullgraph=True),
which fails on any graph break, and fits random data for a few steps: the loss must go down. On CUDA the
script then times forward + backward of the attention-score block P = softmax(mask(scale · Q Kᵀ)), qksoftmax
against the PyTorch formulation softmax(masked_fill(q @ kᵀ · scale)), eager and compiled, and prints the
speed-ups. On the CPU it trains only.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
from collections.abc import Callable

import torch
from torch import nn

import qksoftmax

MLP_RATIO = 4


@dataclasses.dataclass
class Config:
    device: str = "auto"  # "auto": CUDA when present, else the CPU
    # The block and its training on random data.
    batch: int = 8
    seq: int = 128
    width: int = 256
    heads: int = 4
    kv_heads: int = 2
    steps: int = 20
    lr: float = 3e-3
    seed: int = 0
    compile_backend: str = "inductor"
    # The score block timed on CUDA: bfloat16, causal, Hq = Hk.
    time_batch: int = 4
    time_heads: int = 32
    time_seq: int = 1024
    time_head_dim: int = 128
    warmups: int = 3
    repeats: int = 20


def split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """(B, S, heads · D) → (B, heads, S, D)."""
    return x.unflatten(-1, (heads, -1)).transpose(1, 2)


class Attention(nn.Module):
    def __init__(self, width: int, heads: int, kv_heads: int) -> None:
        super().__init__()
        head_dim = width // heads
        self.heads, self.kv_heads = heads, kv_heads
        self.q = nn.Linear(width, heads * head_dim, bias=False)
        self.kv = nn.Linear(width, 2 * kv_heads * head_dim, bias=False)
        self.out = nn.Linear(heads * head_dim, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = split_heads(self.q(x), self.heads)
        k, v = split_heads(self.kv(x), 2 * self.kv_heads).chunk(2, dim=1)
        p = qksoftmax.attention_probs(q, k, causal=True)  # (B, heads, S, S); the backward is fused too
        v = v.repeat_interleave(self.heads // self.kv_heads, dim=1)
        return self.out((p @ v).transpose(1, 2).flatten(2))


class Block(nn.Module):
    def __init__(self, width: int, heads: int, kv_heads: int) -> None:
        super().__init__()
        self.attention_norm = nn.LayerNorm(width)
        self.attention = Attention(width, heads, kv_heads)
        self.mlp_norm = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, MLP_RATIO * width), nn.GELU(), nn.Linear(MLP_RATIO * width, width)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.mlp(self.mlp_norm(x))


def train(config: Config, device: str) -> list[float]:
    """Fits the block to a random target; returns the loss of every step."""
    torch.manual_seed(config.seed)
    block = Block(config.width, config.heads, config.kv_heads).to(device)
    model = torch.compile(block, fullgraph=True, backend=config.compile_backend)
    optimizer = torch.optim.Adam(block.parameters(), lr=config.lr)
    x, target = torch.randn(2, config.batch, config.seq, config.width, device=device)
    losses = []
    for step in range(config.steps):
        with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
            loss = nn.functional.mse_loss(model(x).float(), target)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        print(f"step {step:3d}  loss {losses[-1]:.4f}")
    if not losses[-1] < losses[0]:
        raise AssertionError(f"the loss did not go down: {losses[0]:.4f} → {losses[-1]:.4f}")
    return losses


def torch_probs(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """The PyTorch formulation of the causal score block."""
    masked = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).triu(1)
    s = (q @ k.transpose(-1, -2)) * (1 / math.sqrt(q.shape[-1]))
    return torch.softmax(s.masked_fill(masked, -math.inf), dim=-1)


def qksoftmax_probs(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    return qksoftmax.attention_probs(q, k, causal=True)


def median_ms(run: Callable[[], object], config: Config) -> float:
    """Median CUDA-event time of run() after warm-ups."""
    for _ in range(config.warmups):
        run()
    times = []
    for _ in range(config.repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def time_score_block(config: Config) -> dict[str, float]:
    """Forward + backward (dq, dk from dp) of each formulation, eager and compiled, in milliseconds."""
    shape = (config.time_batch, config.time_heads, config.time_seq, config.time_head_dim)
    q, k = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    dp = torch.randn(*shape[:-1], config.time_seq, device="cuda", dtype=torch.bfloat16)
    times = {}
    for name, probs in (("qksoftmax", qksoftmax_probs), ("torch", torch_probs)):
        for mode, fn in (("eager", probs), ("compiled", torch.compile(probs, fullgraph=True))):
            times[f"{name} {mode}"] = median_ms(lambda fn=fn: torch.autograd.grad(fn(q, k), (q, k), dp), config)
    return times


def main(config: Config) -> dict[str, object]:
    device = ("cuda" if torch.cuda.is_available() else "cpu") if config.device == "auto" else config.device
    print(f"training a tiny block on {device} (torch.compile fullgraph=True, backend {config.compile_backend})")
    result: dict[str, object] = {"losses": train(config, device)}
    if device != "cuda":
        print("timing the attention-score block needs a CUDA GPU: skipped")
        return result
    times = time_score_block(config)
    print(f"score block forward + backward, bf16, causal, (B, H, S, D) = ({config.time_batch}, "
          f"{config.time_heads}, {config.time_seq}, {config.time_head_dim}), median of {config.repeats}:")
    for name, ms in times.items():
        print(f"  {name:20s} {ms * 1e3:9.1f} µs")
    for baseline in ("torch eager", "torch compiled"):
        print(f"  speed-up of qksoftmax eager over {baseline}: {times[baseline] / times['qksoftmax eager']:.2f}x")
    result["times_ms"] = times
    return result


def parse_config(argv: list[str] | None = None) -> Config:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for field in dataclasses.fields(Config):
        default = field.default
        parser.add_argument(f"--{field.name.replace('_', '-')}", type=type(default), default=default)
    return Config(**vars(parser.parse_args(argv)))


if __name__ == "__main__":
    main(parse_config())
