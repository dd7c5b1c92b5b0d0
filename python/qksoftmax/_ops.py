"""The torch custom ops of qksoftmax, their autograd, and the torch side of the public functions.

    torch.ops.qksoftmax.forward(q, k, scale, causal, save) -> (p, lse)      differentiable in q and k
    torch.ops.qksoftmax.backward_recompute(q, k, dp, lse, scale, causal) -> (dq, dk)     lse optional
    torch.ops.qksoftmax.backward_saved_p(q, k, p, dp, scale, causal) -> (dq, dk)

scale is a float or None (1 / sqrt(D)), causal a bool; save ("p" or "lse") is what the forward keeps for its
backward (see qksoftmax.attention_probs). Every op allocates its outputs (contiguous) and its workspace with
q.new_empty, through the caching allocator, runs on the current CUDA stream of its tensors' device (whatever
device is current) and writes none of its inputs:
the ops run in eager mode, under torch.compile (fake implementations; no graph breaks) and inside CUDA graph
capture. The package imports this module whenever torch is installed, so that the ops exist before
torch.compile traces a call.

The public functions (bottom) call the ops whenever anything may need to see them: torch.compile, fake or
other tensor subclasses, dispatch and torch-function modes, functorch transforms. A plain eager call goes
to the same C++ API directly (eager_forward / eager_backward; attention_probs through an autograd.Function
doing what the forward op and its registered backward do, or, where no graph is recorded, eager_forward
alone): the ops' dispatch and autograd wrappers cost more host time than the kernels of a small call
(docs/PYTORCH.md, "The eager fast path").
"""

from typing import Any, Optional  # no PEP 563 here: torch infers the op schemas from these annotations

import torch
import torch.autograd.forward_ad as _forward_ad
from torch import Tensor

from . import _C, _core
from ._core import (
    ATTENTION_PROBS,
    BACKWARD,
    CALL_ERRORS,
    DEFAULT_SAVE,
    FORWARD,
    SAVE_LSE,
    SAVE_P,
    check_backward,
    check_forward,
    check_options,
    probs_shape,
)
from ._frames import TorchFrame

FORWARD_OP = "qksoftmax::forward"
BACKWARD_RECOMPUTE_OP = "qksoftmax::backward_recompute"
BACKWARD_SAVED_P_OP = "qksoftmax::backward_saved_p"

# One C++ call per operation on torch tensors: the inputs described, the outputs allocated (q.new_empty), the call
# validated once and run on the tensors' device, on its current stream (qksoftmax._C.torch_forward / torch_backward).
_torch_forward = _C.torch_forward
_torch_backward = _C.torch_backward


def check_save(where: str, save: object) -> None:
    if save not in (SAVE_P, SAVE_LSE):
        raise ValueError(f"{where}: save must be {SAVE_P!r} or {SAVE_LSE!r}, got {save!r}")


@torch.library.custom_op(FORWARD_OP, mutates_args=())
def forward_op(q: Tensor, k: Tensor, scale: Optional[float], causal: bool, save: str) -> tuple[Tensor, Tensor]:
    check_save(FORWARD_OP, save)
    return _torch_forward(q, k, scale, causal)


def _check_devices(where: str, q: Tensor, **tensors: Optional[Tensor]) -> None:
    """Every tensor on q's device. The dispatcher runs the fake implementations whenever any input is on the meta
    device: without this, a call mixing devices would return empty tensors on q's device."""
    for name, x in tensors.items():
        if x is not None and x.device != q.device:
            raise ValueError(f"{where}: {name} must be on {q.device} like q, got {x.device}")


def _check_saved_p(p: Optional[Tensor]) -> None:
    """backward_saved_p's p is required (eager calls of an op pass None through a Tensor argument)."""
    if p is None:
        raise TypeError(f"{BACKWARD_SAVED_P_OP}: p must be a torch.Tensor, got NoneType")


@forward_op.register_fake
def _forward_fake(q: Tensor, k: Tensor, scale: Optional[float], causal: bool, save: str) -> tuple[Tensor, Tensor]:
    check_save(FORWARD_OP, save)
    _check_devices(FORWARD_OP, q, k=k)
    shape = probs_shape(FORWARD_OP, q, k)
    return q.new_empty(shape), q.new_empty(shape[:-1], dtype=torch.float32)


@torch.library.custom_op(BACKWARD_RECOMPUTE_OP, mutates_args=())
def backward_recompute_op(
    q: Tensor, k: Tensor, dp: Tensor, lse: Optional[Tensor], scale: Optional[float], causal: bool
) -> tuple[Tensor, Tensor]:
    return _torch_backward(q, k, dp, None, lse, scale, causal)


@torch.library.custom_op(BACKWARD_SAVED_P_OP, mutates_args=())
def backward_saved_p_op(
    q: Tensor, k: Tensor, p: Tensor, dp: Tensor, scale: Optional[float], causal: bool
) -> tuple[Tensor, Tensor]:
    _check_saved_p(p)
    return _torch_backward(q, k, dp, p, None, scale, causal)


def _gradients_fake(where: str, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
    probs_shape(where, q, k)
    return q.new_empty(q.shape), k.new_empty(k.shape)


@backward_recompute_op.register_fake
def _backward_recompute_fake(
    q: Tensor, k: Tensor, dp: Tensor, lse: Optional[Tensor], scale: Optional[float], causal: bool
) -> tuple[Tensor, Tensor]:
    _check_devices(BACKWARD_RECOMPUTE_OP, q, k=k, dp=dp, lse=lse)
    return _gradients_fake(BACKWARD_RECOMPUTE_OP, q, k)


@backward_saved_p_op.register_fake
def _backward_saved_p_fake(
    q: Tensor, k: Tensor, p: Tensor, dp: Tensor, scale: Optional[float], causal: bool
) -> tuple[Tensor, Tensor]:
    _check_saved_p(p)
    _check_devices(BACKWARD_SAVED_P_OP, q, k=k, p=p, dp=dp)
    return _gradients_fake(BACKWARD_SAVED_P_OP, q, k)


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, Tensor]) -> None:
    q, k, scale, causal, save = inputs
    p, lse = output
    ctx.mark_non_differentiable(lse)  # the fused backward takes dP only
    ctx.save_for_backward(q, k, p if save == SAVE_P else lse)
    ctx.scale, ctx.causal, ctx.save = scale, causal, save


def _backward_through_ops(
    q: Tensor, k: Tensor, dp: Tensor, kept: Tensor, scale: Optional[float], causal: bool, save: str
) -> tuple[Tensor, Tensor]:
    """(dq, dk) by the backward op that matches what the forward kept (P or the LSE)."""
    if save == SAVE_P:
        return torch.ops.qksoftmax.backward_saved_p(q, k, kept, dp, scale, causal)
    return torch.ops.qksoftmax.backward_recompute(q, k, dp, kept, scale, causal)


def _backward(ctx: Any, dp: Tensor, _: Tensor) -> tuple[Optional[Tensor], ...]:
    q, k, kept = ctx.saved_tensors
    dq, dk = _backward_through_ops(q, k, dp, kept, ctx.scale, ctx.causal, ctx.save)
    return dq, dk, None, None, None


forward_op.register_autograd(_backward, setup_context=_setup_context)


def _no_second_derivative(ctx: Any, *grads: Tensor) -> None:
    raise NotImplementedError(
        "qksoftmax: no second derivative is implemented (double backward, e.g. torch.autograd.grad with "
        "create_graph=True through attention_probs, then a backward of its gradients)"
    )


# A graph of the first derivative (create_graph=True) must refuse to be differentiated, not treat dq as a constant.
backward_recompute_op.register_autograd(_no_second_derivative)
backward_saved_p_op.register_autograd(_no_second_derivative)


# The eager fast path.

_grad_enabled = torch.is_grad_enabled
_is_compiling = torch.compiler.is_compiling  # torch.compile sees the same function (True while it traces)
# Whether a call on q and k may skip the ops: plain tensors (torch.Tensor or nn.Parameter exactly, no subclass:
# fake, functional, DTensor, ...), no dispatch or torch-function mode and no functorch transform active (False
# where this torch cannot tell). _C.torch_forward / torch_backward make the same test with plain_only=True.
plain_eager = _C.plain_eager


def eager_forward(where: str, q: Tensor, k: Tensor, scale: Optional[float], causal: bool) -> tuple[Tensor, Tensor]:
    """(p, lse) by one C++ call; a refusal is explained by the checks."""
    try:
        return _torch_forward(q, k, scale, causal)
    except CALL_ERRORS:
        _core.check_forward(TorchFrame(where, q), q, k)
        raise


def eager_backward(
    where: str,
    q: Tensor,
    k: Tensor,
    dp: Tensor,
    p: Optional[Tensor],
    lse: Optional[Tensor],
    scale: Optional[float],
    causal: bool,
) -> tuple[Tensor, Tensor]:
    """(dq, dk) by one C++ call, as eager_forward (p, lse)."""
    try:
        return _torch_backward(q, k, dp, p, lse, scale, causal)
    except CALL_ERRORS:
        _core.check_backward(TorchFrame(where, q), q, k, dp, p, lse)
        raise


if hasattr(_forward_ad, "_current_level"):  # -1 outside torch.autograd.forward_ad.dual_level()

    def _records_graph(q: Tensor, k: Tensor) -> bool:
        """Whether autograd would record attention_probs: grad mode with an input that requires grad, or a
        forward-mode AD level open (the autograd.Function refuses dual tensors, as the op does)."""
        return (_grad_enabled() and (q.requires_grad or k.requires_grad)) or _forward_ad._current_level >= 0

else:  # this torch cannot tell: the autograd.Function is always right

    def _records_graph(q: Tensor, k: Tensor) -> bool:
        return True


class _AttentionProbs(torch.autograd.Function):
    """attention_probs on plain eager tensors: the forward op and its registered backward without the
    dispatcher (same saved tensors, same C++ calls, same results). The options travel as one tuple
    (scale, causal, save): apply() looks at each argument and backward returns a gradient (None) for each."""

    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, options: tuple[Optional[float], bool, str]) -> Tensor:
        scale, causal, save = options
        p, lse = eager_forward(ATTENTION_PROBS, q, k, scale, causal)
        ctx.save_for_backward(q, k, p if save == SAVE_P else lse)
        ctx.options = options
        return p

    @staticmethod
    def backward(ctx: Any, dp: Tensor) -> tuple[Optional[Tensor], ...]:
        q, k, kept = ctx.saved_tensors
        scale, causal, save = ctx.options
        if _grad_enabled():  # create_graph: the ops' node refuses a second backward instead of a silent 0
            dq, dk = _backward_through_ops(q, k, dp, kept, scale, causal, save)
        elif save == SAVE_P:
            dq, dk = eager_backward(ATTENTION_PROBS, q, k, dp, kept, None, scale, causal)
        else:
            dq, dk = eager_backward(ATTENTION_PROBS, q, k, dp, None, kept, scale, causal)
        return dq, dk, None


# The public functions on torch tensors. In eager mode scale and causal are checked first (the C++ binding
# would take True for 1.0); on plain tensors the call goes to the C++ API, whose validation is the only one
# (the checks phrase its refusals); other eager tensors are checked, then handed to the ops. A compiled graph
# calls the ops, which the C++ API validates.


def forward(q: Tensor, k: Tensor, scale: object, causal: object) -> tuple[Tensor, Tensor]:
    if not _is_compiling():
        if scale is not None or type(causal) is not bool:
            scale, causal = check_options(FORWARD, scale, causal)
        try:
            out = _torch_forward(q, k, scale, causal, True)  # None: not plain tensors, or a mode is active
        except CALL_ERRORS:
            _core.check_forward(TorchFrame(FORWARD, q), q, k)
            raise
        if out is not None:
            return out
        check_forward(TorchFrame(FORWARD, q), q, k)
    return torch.ops.qksoftmax.forward(q.detach(), k.detach(), scale, causal, DEFAULT_SAVE)


def backward(
    q: Tensor, k: Tensor, dp: Tensor, p: Optional[Tensor], lse: Optional[Tensor], scale: object, causal: object
) -> tuple[Tensor, Tensor]:
    if not _is_compiling():
        if scale is not None or type(causal) is not bool:
            scale, causal = check_options(BACKWARD, scale, causal)
        try:
            out = _torch_backward(q, k, dp, p, lse, scale, causal, True)  # None: as forward's
        except CALL_ERRORS:
            _core.check_backward(TorchFrame(BACKWARD, q), q, k, dp, p, lse)
            raise
        if out is not None:
            return out
        check_backward(TorchFrame(BACKWARD, q), q, k, dp, p, lse)
    q, k, dp, p, lse = (None if x is None else x.detach() for x in (q, k, dp, p, lse))
    if p is None:
        return torch.ops.qksoftmax.backward_recompute(q, k, dp, lse, scale, causal)
    return torch.ops.qksoftmax.backward_saved_p(q, k, p, dp, scale, causal)


def attention_probs(q: Tensor, k: Tensor, scale: object, causal: object, save: object) -> Tensor:
    check_save(ATTENTION_PROBS, save)
    if not _is_compiling():
        if scale is not None or type(causal) is not bool:
            scale, causal = check_options(ATTENTION_PROBS, scale, causal)
        if plain_eager(q, k):
            if _records_graph(q, k):
                return _AttentionProbs.apply(q, k, (scale, causal, save))
            return eager_forward(ATTENTION_PROBS, q, k, scale, causal)[0]
        check_forward(TorchFrame(ATTENTION_PROBS, q), q, k)
    p, _ = torch.ops.qksoftmax.forward(q, k, scale, causal, save)
    return p
