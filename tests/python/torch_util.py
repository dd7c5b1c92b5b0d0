"""What the torch tests share: the CUDA mark, inputs, tolerances and the pure-PyTorch formulation.

Import only after pytest.importorskip("torch").
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from qk_reference import TOLERANCE, normal

HAS_CUDA = torch.cuda.is_available()
requires_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs torch with a CUDA device")

DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def tolerance(dtype: torch.dtype) -> float:
    return TOLERANCE[str(dtype).removeprefix("torch.")]


def tensors(seed: int, dtype: torch.dtype, device: str, *shapes: tuple[int, ...]) -> list[torch.Tensor]:
    return [torch.from_numpy(x).to(device=device, dtype=dtype) for x in normal(seed, *shapes)]


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """The values of t, exactly, in fp64 (the reference's inputs)."""
    return t.detach().cpu().double().numpy()


def torch_probs(q: torch.Tensor, k: torch.Tensor, causal: bool = True) -> torch.Tensor:
    """Pure PyTorch P = softmax(masked_fill(q kᵀ / sqrt(D))) (the autograd reference), GQA included."""
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if causal:
        masked = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1)
        s = s.masked_fill(masked, -math.inf)
    return torch.softmax(s, dim=-1)
