"""The torch custom ops of qksoftmax, their autograd, and the torch side of the public functions.

    torch.ops.qksoftmax.forward(q, k, scale, causal, save) -> (p, lse)      differentiable in q and k
    torch.ops.qksoftmax.backward_recompute(q, k, dp, lse, scale, causal) -> (dq, dk)     lse optional
    torch.ops.qksoftmax.backward_saved_p(q, k, p, dp, scale, causal) -> (dq, dk)

scale is a float or None (1 / sqrt(D)), causal a bool; save ("p" or "lse") is what the forward keeps for its
backward (see qksoftmax.attention_probs). Every op allocates its outputs (contiguous) and its workspace with
torch.empty, through the caching allocator, runs on the current CUDA stream and writes none of its inputs:
the ops run in eager mode, under torch.compile (fake implementations; no graph breaks) and inside CUDA graph
capture. The package imports this module whenever torch is installed, so that the ops exist before
torch.compile traces a call.
"""

from typing import Any, Optional  # no PEP 563 here: torch infers the op schemas from these annotations

import torch
from torch import Tensor

from ._core import (
    ATTENTION_PROBS,
    BACKWARD,
    DEFAULT_SAVE,
    FORWARD,
    SAVE_LSE,
    SAVE_P,
    check_backward,
    check_forward,
    probs_shape,
    run_backward,
    run_forward,
)
from ._frames import TorchFrame

FORWARD_OP = "qksoftmax::forward"
BACKWARD_RECOMPUTE_OP = "qksoftmax::backward_recompute"
BACKWARD_SAVED_P_OP = "qksoftmax::backward_saved_p"


def check_save(where: str, save: object) -> None:
    if save not in (SAVE_P, SAVE_LSE):
        raise ValueError(f"{where}: save must be {SAVE_P!r} or {SAVE_LSE!r}, got {save!r}")


@torch.library.custom_op(FORWARD_OP, mutates_args=())
def forward_op(q: Tensor, k: Tensor, scale: Optional[float], causal: bool, save: str) -> tuple[Tensor, Tensor]:
    check_save(FORWARD_OP, save)
    return run_forward(TorchFrame(FORWARD_OP, q), q, k, scale, causal)


@forward_op.register_fake
def _forward_fake(q: Tensor, k: Tensor, scale: Optional[float], causal: bool, save: str) -> tuple[Tensor, Tensor]:
    check_save(FORWARD_OP, save)
    shape = probs_shape(FORWARD_OP, q, k)
    return q.new_empty(shape), q.new_empty(shape[:-1], dtype=torch.float32)


@torch.library.custom_op(BACKWARD_RECOMPUTE_OP, mutates_args=())
def backward_recompute_op(
    q: Tensor, k: Tensor, dp: Tensor, lse: Optional[Tensor], scale: Optional[float], causal: bool
) -> tuple[Tensor, Tensor]:
    return run_backward(TorchFrame(BACKWARD_RECOMPUTE_OP, q), q, k, dp, None, lse, scale, causal)


@torch.library.custom_op(BACKWARD_SAVED_P_OP, mutates_args=())
def backward_saved_p_op(
    q: Tensor, k: Tensor, p: Tensor, dp: Tensor, scale: Optional[float], causal: bool
) -> tuple[Tensor, Tensor]:
    return run_backward(TorchFrame(BACKWARD_SAVED_P_OP, q), q, k, dp, p, None, scale, causal)


def _gradients_fake(where: str, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
    probs_shape(where, q, k)
    return q.new_empty(q.shape), k.new_empty(k.shape)


@backward_recompute_op.register_fake
def _backward_recompute_fake(
    q: Tensor, k: Tensor, dp: Tensor, lse: Optional[Tensor], scale: Optional[float], causal: bool
) -> tuple[Tensor, Tensor]:
    return _gradients_fake(BACKWARD_RECOMPUTE_OP, q, k)


@backward_saved_p_op.register_fake
def _backward_saved_p_fake(
    q: Tensor, k: Tensor, p: Tensor, dp: Tensor, scale: Optional[float], causal: bool
) -> tuple[Tensor, Tensor]:
    return _gradients_fake(BACKWARD_SAVED_P_OP, q, k)


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, Tensor]) -> None:
    q, k, scale, causal, save = inputs
    p, lse = output
    ctx.mark_non_differentiable(lse)  # the fused backward takes dP only
    ctx.save_for_backward(q, k, p if save == SAVE_P else lse)
    ctx.scale, ctx.causal, ctx.save = scale, causal, save


def _backward(ctx: Any, dp: Tensor, _: Tensor) -> tuple[Optional[Tensor], ...]:
    q, k, kept = ctx.saved_tensors
    if ctx.save == SAVE_P:
        dq, dk = torch.ops.qksoftmax.backward_saved_p(q, k, kept, dp, ctx.scale, ctx.causal)
    else:
        dq, dk = torch.ops.qksoftmax.backward_recompute(q, k, dp, kept, ctx.scale, ctx.causal)
    return dq, dk, None, None, None


forward_op.register_autograd(_backward, setup_context=_setup_context)


# The public functions on torch tensors. Arguments are checked in eager mode only, where the checks phrase
# errors in the caller's terms; a compiled graph calls the ops, which the C++ API validates.


def forward(q: Tensor, k: Tensor, scale: object, causal: object) -> tuple[Tensor, Tensor]:
    if not torch.compiler.is_compiling():
        scale, causal = check_forward(TorchFrame(FORWARD, q), q, k, scale, causal)
    return torch.ops.qksoftmax.forward(q.detach(), k.detach(), scale, causal, DEFAULT_SAVE)


def backward(
    q: Tensor, k: Tensor, dp: Tensor, p: Optional[Tensor], lse: Optional[Tensor], scale: object, causal: object
) -> tuple[Tensor, Tensor]:
    if not torch.compiler.is_compiling():
        scale, causal = check_backward(TorchFrame(BACKWARD, q), q, k, dp, p, lse, scale, causal)
    q, k, dp, p, lse = (None if x is None else x.detach() for x in (q, k, dp, p, lse))
    if p is None:
        return torch.ops.qksoftmax.backward_recompute(q, k, dp, lse, scale, causal)
    return torch.ops.qksoftmax.backward_saved_p(q, k, p, dp, scale, causal)


def attention_probs(q: Tensor, k: Tensor, scale: object, causal: object, save: object) -> Tensor:
    check_save(ATTENTION_PROBS, save)
    if not torch.compiler.is_compiling():
        scale, causal = check_forward(TorchFrame(ATTENTION_PROBS, q), q, k, scale, causal)
    p, _ = torch.ops.qksoftmax.forward(q, k, scale, causal, save)
    return p
