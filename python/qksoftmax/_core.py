"""Checks, allocation and the calls into qksoftmax._C, for any Frame (numpy or torch).

check_* look at every argument to phrase errors in Python terms: the public functions call them first (on
torch tensors in eager mode only). run_* prepare layouts, allocate the outputs and the workspace in q's
framework and call the C++ API, which validates again. The torch custom ops (_ops) call only run_*: in a
compiled graph the C++ validation is the check.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

from . import _C
from ._frames import Frame, type_name

# The public functions, as messages name them.
FORWARD = "qksoftmax.forward"
BACKWARD = "qksoftmax.backward"
ATTENTION_PROBS = "qksoftmax.attention_probs"

# What attention_probs keeps for its backward (save=...): P (saved-P mode) or only the log-sum-exp (recompute).
SAVE_P = "p"
SAVE_LSE = "lse"
DEFAULT_SAVE = SAVE_LSE

Q_DIMS = "(B, Hq, Sq, D)"
K_DIMS = "(B, Hk, Sk, D)"
P_DIMS = "(B, Hq, Sq, Sk)"
LSE_DIMS = "(B, Hq, Sq)"
FLOAT32_MAX = float(np.finfo(np.float32).max)  # the kernels take scale as float32


def check_dims(where: str, name: str, x: Any, dims: str) -> None:
    """x must have as many dimensions as `dims` names, each of size at least 1."""
    rank = dims.count(",") + 1
    # Not min(x.shape): under torch.compile it would guard on how the sizes compare with each other.
    if x.ndim != rank or any(size < 1 for size in x.shape):
        raise ValueError(f"{where}: {name} must have shape {dims} with sizes >= 1, got {tuple(x.shape)}")


def probs_shape(where: str, q: Any, k: Any) -> tuple[int, int, int, int]:
    """(B, Hq, Sq, Sk): the shape of p and dp, from q and k of the right ranks."""
    check_dims(where, "q", q, Q_DIMS)
    check_dims(where, "k", k, K_DIMS)
    batch, q_heads, q_len, _ = q.shape
    return batch, q_heads, q_len, k.shape[2]


def _check_operand(
    frame: Frame, name: str, x: Any, dtype: Any, dims: str, shape: tuple[int, ...], like: str = ""
) -> None:
    """x must be of q's framework and device, with this dtype and shape (`dims` names its dimensions)."""
    frame.check(name, x, dtype, like)
    if tuple(x.shape) != shape:
        raise frame.error(ValueError, f"{name} must have shape {dims} = {shape}, got {tuple(x.shape)}")


def _check_q_k(frame: Frame, q: Any, k: Any) -> tuple[int, int, int, int]:
    """Checks q and k; returns (B, Hq, Sq, Sk)."""
    check_dims(frame.where, "q", q, Q_DIMS)
    frame.check("k", k, q.dtype, like="q")
    check_dims(frame.where, "k", k, K_DIMS)
    batch, q_heads, q_len, head_dim = q.shape
    k_batch, k_heads, k_len, k_head_dim = k.shape
    if k_batch != batch or k_head_dim != head_dim or q_heads % k_heads != 0:
        raise frame.error(
            ValueError,
            f"k must have shape {K_DIMS} with B = {batch}, D = {head_dim} and Hk dividing Hq = {q_heads}, "
            f"got {tuple(k.shape)}",
        )
    return batch, q_heads, q_len, k_len


def _check_options(frame: Frame, scale: object, causal: object) -> tuple[float | None, bool]:
    """Checks scale and causal; returns them as the C++ API takes them."""
    if not isinstance(causal, (bool, np.bool_)):
        raise frame.error(TypeError, f"causal must be a bool, got {type_name(causal)}")
    if scale is None:
        return None, bool(causal)
    if isinstance(scale, (bool, np.bool_)) or not isinstance(scale, numbers.Real):
        raise frame.error(TypeError, f"scale must be a real number or None, got {type_name(scale)}")
    # abs() first: math.isfinite overflows on an int beyond float range (e.g. 10**400).
    if abs(scale) > FLOAT32_MAX or not math.isfinite(scale):
        raise frame.error(ValueError, f"scale must be finite and within float32 range, got {scale}")
    return float(scale), bool(causal)


def check_forward(frame: Frame, q: Any, k: Any, scale: object, causal: object) -> tuple[float | None, bool]:
    """Checks the arguments of a forward call (frame made from q); returns scale and causal, normalised."""
    _check_q_k(frame, q, k)
    return _check_options(frame, scale, causal)


def check_backward(
    frame: Frame, q: Any, k: Any, dp: Any, p: Any, lse: Any, scale: object, causal: object
) -> tuple[float | None, bool]:
    """Checks the arguments of a backward call (frame made from q); returns scale and causal, normalised."""
    shape = _check_q_k(frame, q, k)
    _check_operand(frame, "dp", dp, q.dtype, P_DIMS, shape, like="q")
    if p is not None:
        _check_operand(frame, "p", p, q.dtype, P_DIMS, shape, like="q")
    if lse is not None:
        _check_operand(frame, "lse", lse, frame.float32, LSE_DIMS, shape[:-1])
    return _check_options(frame, scale, causal)


def run_forward(frame: Frame, q: Any, k: Any, scale: float | None, causal: bool) -> tuple[Any, Any]:
    """(p, lse) of q and k, allocated in q's framework (frame) and on its device."""
    shape = probs_shape(frame.where, q, k)
    q, k = frame.prepare(q), frame.prepare(k)
    p = frame.empty(shape, q.dtype)
    lse = frame.empty(shape[:-1], frame.float32)
    with frame.launch() as stream:
        _C.forward(q, k, p, lse, frame.workspace, scale, causal, stream)
    return p, lse


def run_backward(
    frame: Frame, q: Any, k: Any, dp: Any, p: Any, lse: Any, scale: float | None, causal: bool
) -> tuple[Any, Any]:
    """(dq, dk) from dp: saved-P mode when p is given, recompute mode otherwise (frame made from q)."""
    probs_shape(frame.where, q, k)
    q, k, dp, p, lse = (None if x is None else frame.prepare(x) for x in (q, k, dp, p, lse))
    dq = frame.empty(tuple(q.shape), q.dtype)
    dk = frame.empty(tuple(k.shape), k.dtype)
    with frame.launch() as stream:
        _C.backward(q, k, dp, p, lse, dq, dk, frame.workspace, scale, causal, stream)
    return dq, dk
