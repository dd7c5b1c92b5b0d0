"""The calls into qksoftmax._C for numpy arrays, and the checks that phrase a refused call's error, for any
framework (torch tensors go through _ops: one C++ call per operation, _C.torch_forward / torch_backward).

forward / backward lay the inputs out, allocate the outputs in q's framework, and make one plan
(_C.plan_forward / plan_backward: each tensor described once, the call validated once by the C++ API), whose
workspace the Runner allocates before running it. Nothing is checked twice on the way: the C++ API is the
validation. When a call is refused (or an argument is not even an array), check_* look at every argument to
say which one is wrong in Python terms (TypeError for a type or dtype, ValueError for a shape or device, the
refusal chained as its context); where they find nothing, the refusal stands.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

from . import _C
from ._frames import Frame, Runner, type_name

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

# What a call with a wrong argument raises before the checks have looked (the C++ API's ValueError, TypeError
# and NotImplementedError; an attribute or dimension that a non-array or a wrong rank lacks).
CALL_ERRORS = (TypeError, ValueError, NotImplementedError, IndexError, AttributeError)


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


def check_options(where: str, scale: object, causal: object) -> tuple[float | None, bool]:
    """Checks scale and causal (before every call: the C++ binding would take True for 1.0); returns them as
    the C++ API takes them."""
    if type(causal) is bool and (scale is None or (type(scale) is float and -FLOAT32_MAX <= scale <= FLOAT32_MAX)):
        return scale, causal  # the common calls (a NaN fails the comparison)
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"{where}: causal must be a bool, got {type_name(causal)}")
    if scale is None:
        return None, bool(causal)
    if isinstance(scale, (bool, np.bool_)) or not isinstance(scale, numbers.Real):
        raise TypeError(f"{where}: scale must be a real number or None, got {type_name(scale)}")
    # abs() first: math.isfinite overflows on an int beyond float range (e.g. 10**400).
    if abs(scale) > FLOAT32_MAX or not math.isfinite(scale):
        raise ValueError(f"{where}: scale must be finite and within float32 range, got {scale}")
    return float(scale), bool(causal)


def check_forward(frame: Frame, q: Any, k: Any) -> None:
    """Checks the tensors of a forward call (frame made from q)."""
    _check_q_k(frame, q, k)


def check_backward(frame: Frame, q: Any, k: Any, dp: Any, p: Any, lse: Any) -> None:
    """Checks the tensors of a backward call (frame made from q)."""
    shape = _check_q_k(frame, q, k)
    _check_operand(frame, "dp", dp, q.dtype, P_DIMS, shape, like="q")
    if p is not None:
        _check_operand(frame, "p", p, q.dtype, P_DIMS, shape, like="q")
    if lse is not None:
        _check_operand(frame, "lse", lse, frame.float32, LSE_DIMS, shape[:-1])


def forward(runner: Runner, where: str, q: Any, k: Any, scale: float | None, causal: bool) -> tuple[Any, Any]:
    """(p, lse) of q and k, allocated in q's framework and on its device (scale and causal checked). A refusal
    is explained by the checks."""
    try:
        q_shape = q.shape
        shape = (q_shape[0], q_shape[1], q_shape[2], k.shape[2])
        q_in, k_in = runner.prepare(q), runner.prepare(k)
        p = runner.empty(q, shape, q.dtype)
        lse = runner.empty(q, shape[:-1], runner.float32)
        runner.launch(_C.plan_forward(q_in, k_in, p, lse, scale, causal), q)
    except CALL_ERRORS:
        check_forward(runner.frame(where, q), q, k)
        raise
    return p, lse


def backward(
    runner: Runner,
    where: str,
    q: Any,
    k: Any,
    dp: Any,
    p: Any,
    lse: Any,
    scale: float | None,
    causal: bool,
) -> tuple[Any, Any]:
    """(dq, dk) from dp: saved-P mode when p is given, recompute mode otherwise (scale and causal checked). A
    refusal is explained as forward's is."""
    try:
        dq = runner.empty(q, tuple(q.shape), q.dtype)
        dk = runner.empty(q, tuple(k.shape), q.dtype)
        inputs = (None if x is None else runner.prepare(x) for x in (q, k, dp, p, lse))
        runner.launch(_C.plan_backward(*inputs, dq, dk, scale, causal), q)
    except CALL_ERRORS:
        check_backward(runner.frame(where, q), q, k, dp, p, lse)
        raise
    return dq, dk
