"""qksoftmax.forward / backward / attention_probs: numpy arrays straight into qksoftmax._C, torch tensors
through _ops (the custom ops torch.ops.qksoftmax, or for plain eager tensors the same C++ calls directly)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ._core import ATTENTION_PROBS, BACKWARD, DEFAULT_SAVE, FORWARD, check_options
from ._core import backward as run_backward
from ._core import forward as run_forward
from ._frames import NUMPY, numpy_frame, type_name

try:
    import torch
except ImportError:
    _TORCH_TENSOR: Any = ()  # isinstance(x, ()) is False
else:
    from . import _ops  # registers the custom ops

    # What the public functions hand to _ops: an isinstance test inline, plain enough for torch.compile to trace
    # without a graph break (a helper function would cost a Python call per operation).
    _TORCH_TENSOR = torch.Tensor


def _numpy_call(where: str, q: Any, *tensors: Any) -> None:
    """q and every other tensor given are numpy arrays (the C++ API would also take a CPU torch tensor beside
    them, which qksoftmax refuses: outputs follow q's framework); raises the checks' error otherwise."""
    if isinstance(q, np.ndarray) and all(x is None or isinstance(x, np.ndarray) for _, x in tensors):
        return
    numpy_frame(where, q)
    for name, x in tensors:
        if x is not None and not isinstance(x, np.ndarray):
            raise TypeError(f"{where}: {name} must be a numpy.ndarray like q, got {type_name(x)}")


def forward(q: Any, k: Any, *, scale: float | None = None, causal: bool = True) -> tuple[Any, Any]:
    """P = softmax(mask(scale · Q Kᵀ)) and its log-sum-exp.

    Args:
        q: (B, Hq, Sq, D) torch.Tensor (CUDA or CPU) or numpy.ndarray; bfloat16 (torch only), float16,
            float32, or float64 (CPU only). Any strides.
        k: (B, Hk, Sk, D), Hk dividing Hq (query head h uses key head h // (Hq // Hk)); like q in framework,
            device and dtype.
        scale: multiplies Q Kᵀ; None means 1 / sqrt(D).
        causal: mask the positions j > i (top-left aligned, like torch.tril).

    Returns:
        p: (B, Hq, Sq, Sk) in q's dtype, masked positions 0 (a row with every position masked is all 0).
        lse: (B, Hq, Sq) float32 log-sum-exp of each row, -inf for a fully masked row.

    On torch tensors this is torch.ops.qksoftmax.forward (or its C++ call, eager), outside autograd (see
    attention_probs).
    """
    if isinstance(q, _TORCH_TENSOR):
        return _ops.forward(q, k, scale, causal)
    _numpy_call(FORWARD, q, ("k", k))
    scale, causal = check_options(FORWARD, scale, causal)
    return run_forward(NUMPY, FORWARD, q, k, scale, causal)


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
    forward's lse. Masked positions of dp and p are never read, and dp is never written.

    Args:
        q: (B, Hq, Sq, D), k: (B, Hk, Sk, D) as for forward.
        dp: (B, Hq, Sq, Sk) in q's dtype.
        p: optional (B, Hq, Sq, Sk) in q's dtype.
        lse: optional (B, Hq, Sq) float32 as forward returned it (checked but unused in saved-P mode).
        scale, causal: as given to forward.

    Returns:
        dq: (B, Hq, Sq, D) and dk: (B, Hk, Sk, D) (summed over the query heads of each key head), in q's
        dtype, framework and device.

    On torch tensors this is torch.ops.qksoftmax.backward_saved_p or backward_recompute (or their C++ call,
    eager).
    """
    if isinstance(q, _TORCH_TENSOR):
        return _ops.backward(q, k, dp, p, lse, scale, causal)
    _numpy_call(BACKWARD, q, ("k", k), ("dp", dp), ("p", p), ("lse", lse))
    scale, causal = check_options(BACKWARD, scale, causal)
    return run_backward(NUMPY, BACKWARD, q, k, dp, p, lse, scale, causal)


def attention_probs(
    q: Any, k: Any, *, scale: float | None = None, causal: bool = True, save: str = DEFAULT_SAVE
) -> Any:
    """P = softmax(mask(scale · Q Kᵀ)) for torch autograd: fused forward, fused backward.

    q: (B, Hq, Sq, D) and k: (B, Hk, Sk, D) torch tensors, Hk dividing Hq (GQA: dk sums over the query heads
    of each key head); scale and causal as for forward. Returns p: (B, Hq, Sq, Sk) in q's dtype. Works in
    eager mode, under torch.compile (fullgraph, dynamic shapes) and in CUDA graphs.

    save picks what the forward keeps for the backward, beside q and k:
        "lse" (default): the (B, Hq, Sq) float32 log-sum-exp only. The backward recomputes P = exp(S − LSE)
            on chip (recompute mode: one more Q Kᵀ product). P's memory is freed as soon as nothing else
            holds it, and p may be modified in place.
        "p": P itself. The backward reads it (saved-P mode: no Q Kᵀ recompute, but P is read from memory).
            Costs P's memory, (B, Hq, Sq, Sk) elements, until the backward, unless something else holds P
            anyway (as `p @ v` does when v requires grad); p must not be modified in place.
    At the benchmark's sizes (docs/SPEC.md) the recompute mode's speed-of-light time is the lower one (it reads half the
    bytes for one more product), and "lse" never holds more memory than "p": hence the default.
    """
    if not isinstance(q, _TORCH_TENSOR):
        raise TypeError(f"{ATTENTION_PROBS}: q must be a torch.Tensor, got {type_name(q)}")
    return _ops.attention_probs(q, k, scale, causal, save)
