"""qksoftmax.forward / backward / attention_probs: checks, allocation, and the calls into qksoftmax._C."""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

from . import _C
from ._frames import Frame, frame_for, is_torch_tensor, type_name

Q_DIMS = "(B, Hq, Sq, D)"
K_DIMS = "(B, Hk, Sk, D)"
P_DIMS = "(B, Hq, Sq, Sk)"
LSE_DIMS = "(B, Hq, Sq)"
FLOAT32_MAX = float(np.finfo(np.float32).max)  # the kernels take scale as float32


def _check_dims(frame: Frame, name: str, x: Any, dims: str) -> None:
    """x must have as many dimensions as `dims` names, each of size at least 1."""
    rank = dims.count(",") + 1
    if x.ndim != rank or min(x.shape) < 1:
        raise frame.error(ValueError, f"{name} must have shape {dims} with sizes >= 1, got {tuple(x.shape)}")


def _check_operand(
    frame: Frame, name: str, x: Any, dtype: Any, dims: str, shape: tuple[int, ...], like: str = ""
) -> None:
    """x must be of q's framework and device, with this dtype and shape (`dims` names its dimensions)."""
    frame.check(name, x, dtype, like)
    if tuple(x.shape) != shape:
        raise frame.error(ValueError, f"{name} must have shape {dims} = {shape}, got {tuple(x.shape)}")


def _check_q_k(frame: Frame, q: Any, k: Any) -> tuple[int, int, int, int]:
    """Checks q and k; returns (B, Hq, Sq, Sk)."""
    _check_dims(frame, "q", q, Q_DIMS)
    frame.check("k", k, q.dtype, like="q")
    _check_dims(frame, "k", k, K_DIMS)
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
    if not math.isfinite(scale) or abs(scale) > FLOAT32_MAX:
        raise frame.error(ValueError, f"scale must be finite and within float32 range, got {scale}")
    return float(scale), bool(causal)


def _forward(where: str, q: Any, k: Any, scale: object, causal: object) -> tuple[Any, Any]:
    frame = frame_for(where, q)
    batch, q_heads, q_len, k_len = _check_q_k(frame, q, k)
    scale, causal = _check_options(frame, scale, causal)
    q, k = frame.prepare(q), frame.prepare(k)
    p = frame.empty((batch, q_heads, q_len, k_len), q.dtype)
    lse = frame.empty((batch, q_heads, q_len), frame.float32)
    with frame.launch() as stream:
        workspace = frame.workspace(_C.forward_workspace_size(q, k, p, lse, scale, causal))
        _C.forward(q, k, p, lse, workspace, scale, causal, stream)
    return p, lse


def _backward(
    where: str, q: Any, k: Any, dp: Any, p: Any, lse: Any, scale: object, causal: object
) -> tuple[Any, Any]:
    frame = frame_for(where, q)
    batch, q_heads, q_len, k_len = _check_q_k(frame, q, k)
    probs_shape = (batch, q_heads, q_len, k_len)
    _check_operand(frame, "dp", dp, q.dtype, P_DIMS, probs_shape, like="q")
    if p is not None:
        _check_operand(frame, "p", p, q.dtype, P_DIMS, probs_shape, like="q")
    if lse is not None:
        _check_operand(frame, "lse", lse, frame.float32, LSE_DIMS, probs_shape[:-1])
    scale, causal = _check_options(frame, scale, causal)
    q, k, dp, p, lse = (None if x is None else frame.prepare(x) for x in (q, k, dp, p, lse))
    dq = frame.empty(tuple(q.shape), q.dtype)
    dk = frame.empty(tuple(k.shape), k.dtype)
    with frame.launch() as stream:
        workspace = frame.workspace(_C.backward_workspace_size(q, k, dp, p, lse, dq, dk, scale, causal))
        _C.backward(q, k, dp, p, lse, dq, dk, workspace, scale, causal, stream)
    return dq, dk


def forward(q: Any, k: Any, *, scale: float | None = None, causal: bool = True) -> tuple[Any, Any]:
    """P = softmax(mask(scale · Q Kᵀ)) and its log-sum-exp.

    Args:
        q: (B, Hq, Sq, D) torch.Tensor (CUDA or CPU) or numpy.ndarray; bfloat16 (torch only), float16
            or float32. Any strides.
        k: (B, Hk, Sk, D), Hk dividing Hq (query head h uses key head h // (Hq // Hk)); like q in framework,
            device and dtype.
        scale: multiplies Q Kᵀ; None means 1 / sqrt(D).
        causal: mask the positions j > i (top-left aligned, like torch.tril).

    Returns:
        p: (B, Hq, Sq, Sk) in q's dtype, masked positions 0 (a row with every position masked is all 0).
        lse: (B, Hq, Sq) float32 log-sum-exp of each row, -inf for a fully masked row.
    """
    return _forward("qksoftmax.forward", q, k, scale, causal)


def backward(
    q: Any,
    k: Any,
    dp: Any,
    *,
    p: Any = None,
    lse: Any = None,
    scale: float | None = None,
    causal: bool = True,
) -> tuple[Any, Any]:
    """dQ and dK from dP = ∂L/∂P, P = softmax(mask(scale · Q Kᵀ)).

    Saved-P mode when p is given (P as forward returned it); recompute mode otherwise, faster with the
    forward's lse. Masked positions of dp and p are never read.

    Args:
        q: (B, Hq, Sq, D), k: (B, Hk, Sk, D) as for forward.
        dp: (B, Hq, Sq, Sk) in q's dtype.
        p: optional (B, Hq, Sq, Sk) in q's dtype.
        lse: optional (B, Hq, Sq) float32 as forward returned it (checked but unused in saved-P mode).
        scale, causal: as given to forward.

    Returns:
        dq: (B, Hq, Sq, D) and dk: (B, Hk, Sk, D) (summed over the query heads of each key head), in q's
        dtype, framework and device.
    """
    return _backward("qksoftmax.backward", q, k, dp, p, lse, scale, causal)


def attention_probs(q: Any, k: Any, *, scale: float | None = None, causal: bool = True) -> Any:
    """P = softmax(mask(scale · Q Kᵀ)) for torch autograd: fused forward, fused recompute backward.

    q: (B, Hq, Sq, D) and k: (B, Hk, Sk, D) torch tensors (see forward); returns p: (B, Hq, Sq, Sk).
    The backward pass gives dq and dk from the forward's saved q, k and log-sum-exp (P is not saved).
    """
    if not is_torch_tensor(q):
        raise TypeError(f"qksoftmax.attention_probs: q must be a torch.Tensor, got {type_name(q)}")
    from ._autograd import AttentionProbs

    return AttentionProbs.apply(q, k, scale, causal)
