"""The fp64 numpy reference of the math (docs/SPEC.md, "The math"), and the helpers the tests share."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import qksoftmax

# The accuracy bar, by dtype name: relative Frobenius error bounds, read from the table that the C++ tests and
# the bench use (tests/common/accuracy.h).
ACCURACY_TABLE = Path(__file__).resolve().parents[1] / "common" / "accuracy.h"
TOLERANCE = {
    name: float(bound)
    for name, bound in re.findall(r'\{DType::k\w+, "(\w+)", ([0-9.e+-]+)\}', ACCURACY_TABLE.read_text())
}
CUDA_HEAD_DIM = 64  # a head dimension the CUDA kernels cover
# The three ways of calling qksoftmax.backward (see run_backward).
BACKWARD_MODES = ["recompute", "recompute_lse", "saved_p"]


@dataclass(frozen=True)
class Case:
    batch: int
    q_heads: int
    k_heads: int
    q_len: int
    k_len: int
    head_dim: int

    @property
    def q_shape(self) -> tuple[int, int, int, int]:
        return (self.batch, self.q_heads, self.q_len, self.head_dim)

    @property
    def k_shape(self) -> tuple[int, int, int, int]:
        return (self.batch, self.k_heads, self.k_len, self.head_dim)

    @property
    def p_shape(self) -> tuple[int, int, int, int]:
        return (self.batch, self.q_heads, self.q_len, self.k_len)

    def __str__(self) -> str:
        return f"B{self.batch}-H{self.q_heads}/{self.k_heads}-S{self.q_len}x{self.k_len}-D{self.head_dim}"


def normal(seed: int, *shapes: tuple[int, ...]) -> list[np.ndarray]:
    """Fresh N(0, 1) float32 arrays, one per shape."""
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape, dtype=np.float32) for shape in shapes]


def rel_error(out, ref: np.ndarray) -> float:
    """‖out − ref‖ / ‖ref‖ in fp64, ‖out − ref‖ where ref is 0 (NaN if out holds a NaN: it never passes)."""
    out = np.asarray(out, dtype=np.float64)
    return float(np.linalg.norm(out - ref) / (np.linalg.norm(ref) or 1.0))


def causal_mask(q_len: int, k_len: int) -> np.ndarray:
    """True where a position is masked: j > i."""
    return np.triu(np.ones((q_len, k_len), dtype=bool), 1)


def _mask(q_len: int, k_len: int, causal: bool) -> np.ndarray:
    return causal_mask(q_len, k_len) if causal else np.zeros((q_len, k_len), dtype=bool)


def _expand_heads(k: np.ndarray, q_heads: int) -> np.ndarray:
    return np.repeat(k, q_heads // k.shape[1], axis=1)


def _scale(q: np.ndarray, scale: float | None) -> float:
    return 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale


def forward(q, k, scale: float | None = None, causal: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(P, LSE) in fp64 from inputs of any dtype."""
    q = np.asarray(q, dtype=np.float64)
    k = _expand_heads(np.asarray(k, dtype=np.float64), q.shape[1])
    s = _scale(q, scale) * (q @ k.swapaxes(-1, -2))
    s[..., _mask(q.shape[2], k.shape[2], causal)] = -np.inf
    row_max = s.max(axis=-1, keepdims=True)
    row_max = np.where(np.isfinite(row_max), row_max, 0.0)
    e = np.exp(s - row_max)
    total = e.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(total > 0, e / total, 0.0)
        lse = np.log(total) + row_max
    return p, lse[..., 0]


def backward(q, k, dp, scale: float | None = None, causal: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(dQ, dK) in fp64; masked positions of dp are not read."""
    p, _ = forward(q, k, scale, causal)
    q = np.asarray(q, dtype=np.float64)
    k64 = np.asarray(k, dtype=np.float64)
    dp = np.where(_mask(p.shape[2], p.shape[3], causal), 0.0, np.asarray(dp, dtype=np.float64))
    ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True))
    scale = _scale(q, scale)
    dq = scale * (ds @ _expand_heads(k64, q.shape[1]))
    dk_per_q_head = scale * (ds.swapaxes(-1, -2) @ q)
    batch, k_heads, k_len, head_dim = k64.shape
    dk = dk_per_q_head.reshape(batch, k_heads, -1, k_len, head_dim).sum(axis=2)
    return dq, dk


def run_backward(q, k, dp, mode: str, **options):
    """qksoftmax.backward called in one of BACKWARD_MODES (p or lse from qksoftmax.forward)."""
    if mode == "recompute":
        return qksoftmax.backward(q, k, dp, **options)
    p, lse = qksoftmax.forward(q, k, **options)
    if mode == "recompute_lse":
        return qksoftmax.backward(q, k, dp, lse=lse, **options)
    return qksoftmax.backward(q, k, dp, p=p, **options)
