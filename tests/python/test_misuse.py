"""Misuse through qksoftmax.* and the torch ops: every bad call raises ValueError, TypeError or NotImplementedError
naming the argument (numpy arrays: test_errors.py). Odd requires_grad flags, torch.no_grad and inference mode
work; a second derivative is refused. With CUDA memory exhausted a call raises torch's OutOfMemoryError, leaves
its inputs alone, and the next call works. CPU tensors wherever the case allows; the CUDA cases skip without a
device."""

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest

import qksoftmax
from qk_reference import CUDA_HEAD_DIM, Case

torch = pytest.importorskip("torch")

from torch_util import requires_cuda, tensors  # noqa: E402  (after the skip: torch_util imports torch)

CASE = Case(1, 2, 1, 4, 5, 8)  # on the CPU; on CUDA with a head dimension its kernels cover
FORWARD_OP = torch.ops.qksoftmax.forward
RECOMPUTE_OP = torch.ops.qksoftmax.backward_recompute
SAVED_P_OP = torch.ops.qksoftmax.backward_saved_p


def valid(device: str = "cpu", dtype=torch.float32) -> SimpleNamespace:
    """Valid arguments of every call, for a test to spoil one of."""
    case = CASE if device == "cpu" else dataclasses.replace(CASE, head_dim=CUDA_HEAD_DIM)
    q, k, dp = tensors(1, dtype, device, case.q_shape, case.k_shape, case.p_shape)
    p, lse = qksoftmax.forward(q, k)
    return SimpleNamespace(q=q, k=k, dp=dp, p=p, lse=lse)


def meta(x):
    return x.to("meta")


# name: (call, exception, text the message must contain)
BAD_CALLS = {
    # qksoftmax.forward / backward / attention_probs (checked in Python)
    "forward q int32": (lambda a: qksoftmax.forward(a.q.int(), a.k), TypeError, "qksoftmax.forward: q must have dtype"),
    "forward q bool": (lambda a: qksoftmax.forward(a.q.bool(), a.k), TypeError, "q must have dtype"),
    "forward q complex": (lambda a: qksoftmax.forward(a.q.to(torch.complex64), a.k), TypeError, "q must have dtype"),
    "forward q sparse": (lambda a: qksoftmax.forward(a.q.to_sparse(), a.k), TypeError,
                         "q must be a strided (dense) torch.Tensor, got layout torch.sparse_coo"),
    "forward k sparse": (lambda a: qksoftmax.forward(a.q, a.k.to_sparse()), TypeError, "k must be a strided"),
    "forward q on meta": (lambda a: qksoftmax.forward(meta(a.q), a.k), ValueError,
                          "q must be on the CPU or a CUDA device, got meta"),
    "forward k on meta": (lambda a: qksoftmax.forward(a.q, meta(a.k)), ValueError, "k must be on cpu like q, got meta"),
    "forward k list": (lambda a: qksoftmax.forward(a.q, a.k.tolist()), TypeError,
                       "k must be a torch.Tensor like q, got list"),
    "forward k numpy": (lambda a: qksoftmax.forward(a.q, a.k.numpy()), TypeError, "got numpy.ndarray"),
    "forward k bfloat16": (lambda a: qksoftmax.forward(a.q, a.k.bfloat16()), TypeError,
                           "k must have dtype torch.float32 like q, got torch.bfloat16"),
    "forward q rank 5": (lambda a: qksoftmax.forward(a.q[None], a.k), ValueError, "q must have shape (B, Hq, Sq, D)"),
    "forward k empty": (lambda a: qksoftmax.forward(a.q, a.k[:, :, :0]), ValueError, "k must have shape"),
    "forward scale tensor": (lambda a: qksoftmax.forward(a.q, a.k, scale=torch.tensor(0.5)), TypeError,
                             "scale must be a real number or None, got torch.Tensor"),
    "forward scale complex": (lambda a: qksoftmax.forward(a.q, a.k, scale=1j), TypeError, "scale must be a real"),
    "forward scale inf": (lambda a: qksoftmax.forward(a.q, a.k, scale=float("inf")), ValueError,
                          "scale must be finite"),
    "forward causal None": (lambda a: qksoftmax.forward(a.q, a.k, causal=None), TypeError,
                            "causal must be a bool, got NoneType"),
    "forward causal tensor": (lambda a: qksoftmax.forward(a.q, a.k, causal=torch.tensor(True)), TypeError,
                              "causal must be a bool, got torch.Tensor"),
    "backward dp list": (lambda a: qksoftmax.backward(a.q, a.k, a.dp.tolist()), TypeError,
                         "qksoftmax.backward: dp must be a torch.Tensor like q, got list"),
    "backward dp on meta": (lambda a: qksoftmax.backward(a.q, a.k, meta(a.dp)), ValueError,
                            "dp must be on cpu like q, got meta"),
    "backward dp float16": (lambda a: qksoftmax.backward(a.q, a.k, a.dp.half()), TypeError,
                            "dp must have dtype torch.float32 like q"),
    "backward dp sparse": (lambda a: qksoftmax.backward(a.q, a.k, a.dp.to_sparse()), TypeError, "dp must be a strided"),
    "backward p numpy": (lambda a: qksoftmax.backward(a.q, a.k, a.dp, p=a.p.numpy()), TypeError,
                         "p must be a torch.Tensor like q, got numpy.ndarray"),
    "backward p shape": (lambda a: qksoftmax.backward(a.q, a.k, a.dp, p=a.p[..., :2]), ValueError, "p must have shape"),
    "backward lse float16": (lambda a: qksoftmax.backward(a.q, a.k, a.dp, lse=a.lse.half()), TypeError,
                             "lse must have dtype torch.float32, got torch.float16"),
    "backward lse on meta": (lambda a: qksoftmax.backward(a.q, a.k, a.dp, lse=meta(a.lse)), ValueError,
                             "lse must be on cpu like q, got meta"),
    "backward lse shape": (lambda a: qksoftmax.backward(a.q, a.k, a.dp, lse=a.lse[None]), ValueError,
                           "lse must have shape (B, Hq, Sq)"),
    "attention_probs q numpy": (lambda a: qksoftmax.attention_probs(a.q.numpy(), a.k), TypeError,
                                "qksoftmax.attention_probs: q must be a torch.Tensor, got numpy.ndarray"),
    "attention_probs k on meta": (lambda a: qksoftmax.attention_probs(a.q, meta(a.k)), ValueError,
                                  "k must be on cpu like q, got meta"),
    "attention_probs save None": (lambda a: qksoftmax.attention_probs(a.q, a.k, save=None), ValueError,
                                  "save must be 'p' or 'lse', got None"),
    "attention_probs scale str": (lambda a: qksoftmax.attention_probs(a.q, a.k, scale="1"), TypeError,
                                  "scale must be a real number"),
    # The torch ops: their fake implementations (any input on the meta device) and the C++ validation.
    "op forward k on meta": (lambda a: FORWARD_OP(a.q, meta(a.k), None, True, "lse"), ValueError,
                             "qksoftmax::forward: k must be on cpu like q, got meta"),
    "op forward k bfloat16": (lambda a: FORWARD_OP(a.q, a.k.bfloat16(), None, True, "lse"), ValueError,
                              "k: expected dtype float32 like q, got bfloat16"),
    "op forward k int32": (lambda a: FORWARD_OP(a.q, a.k.int(), None, True, "lse"), TypeError, "k must have dtype"),
    "op forward q rank 3": (lambda a: FORWARD_OP(a.q[0], a.k, None, True, "lse"), ValueError, "q: expected rank 4"),
    "op forward scale nan": (lambda a: FORWARD_OP(a.q, a.k, float("nan"), True, "lse"), ValueError,
                             "options.scale: expected a finite value"),
    "op forward save": (lambda a: FORWARD_OP(a.q, a.k, None, True, "P"), ValueError, "save must be 'p' or 'lse'"),
    "op recompute dp on meta": (lambda a: RECOMPUTE_OP(a.q, a.k, meta(a.dp), None, None, True), ValueError,
                                "qksoftmax::backward_recompute: dp must be on cpu like q, got meta"),
    "op recompute lse on meta": (lambda a: RECOMPUTE_OP(a.q, a.k, a.dp, meta(a.lse), None, True), ValueError,
                                 "lse must be on cpu like q, got meta"),
    "op recompute lse float16": (lambda a: RECOMPUTE_OP(a.q, a.k, a.dp, a.lse.half(), None, True), ValueError,
                                 "lse: expected dtype float32, got float16"),
    "op recompute dp shape": (lambda a: RECOMPUTE_OP(a.q, a.k, a.dp[..., :4], None, None, True), ValueError,
                              "dp: expected shape (1, 2, 4, 5)"),
    "op saved_p p None": (lambda a: SAVED_P_OP(a.q, a.k, None, a.dp, None, True), TypeError,
                          "qksoftmax::backward_saved_p: p must be a torch.Tensor, got NoneType"),
    "op saved_p p on meta": (lambda a: SAVED_P_OP(a.q, a.k, meta(a.p), a.dp, None, True), ValueError,
                             "p must be on cpu like q, got meta"),
}


@pytest.mark.parametrize("name", BAD_CALLS)
def test_bad_call(name):
    call, error, message = BAD_CALLS[name]
    with pytest.raises(error) as raised:
        call(valid())
    assert message in str(raised.value)


def test_op_argument_types_are_checked_by_torch():
    """Arguments of the wrong Python type never reach qksoftmax through the ops: torch's dispatcher refuses them
    against the op's schema (with its own RuntimeError, naming the argument)."""
    a = valid()
    with pytest.raises(RuntimeError, match="for argument 'q'"):
        FORWARD_OP(a.q.tolist(), a.k, None, True, "lse")
    with pytest.raises(RuntimeError, match="for argument 'scale'"):
        FORWARD_OP(a.q, a.k, "0.5", True, "lse")


@pytest.mark.parametrize("save", ["lse", "p"])
def test_gradient_of_one_input_only(save):
    """attention_probs with only k requiring grad: k's gradient as when both do, none for q."""
    a = valid()
    weight = tensors(2, torch.float32, "cpu", CASE.p_shape)[0]
    both = [t.clone().requires_grad_(True) for t in (a.q, a.k)]
    (qksoftmax.attention_probs(*both, save=save) * weight).sum().backward()
    k_only = a.k.clone().requires_grad_(True)
    (qksoftmax.attention_probs(a.q, k_only, save=save) * weight).sum().backward()
    assert a.q.grad is None
    torch.testing.assert_close(k_only.grad, both[1].grad, rtol=0, atol=0)


def test_inputs_requiring_grad_outside_autograd():
    """forward and backward are not differentiable: inputs that require grad (dp, p and lse too) are read as
    values, and nothing they return requires grad."""
    a = valid()
    q, k, dp, p, lse = (t.clone().requires_grad_(True) for t in (a.q, a.k, a.dp, a.p, a.lse))
    for dq, dk in (qksoftmax.backward(q, k, dp, p=p), qksoftmax.backward(q, k, dp, lse=lse)):
        assert not dq.requires_grad and not dk.requires_grad
        torch.testing.assert_close(dq, qksoftmax.backward(a.q, a.k, a.dp)[0])


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_without_autograd(mode):
    """Under torch.no_grad and torch.inference_mode every call works, gives what it gives outside, and builds
    no graph."""
    a = valid()
    q, k = (t.clone().requires_grad_(True) for t in (a.q, a.k))
    expected_p = qksoftmax.attention_probs(q, k).detach()
    expected_dq, _ = qksoftmax.backward(a.q, a.k, a.dp)
    with torch.no_grad() if mode == "no_grad" else torch.inference_mode():
        p = qksoftmax.attention_probs(q, k)
        p_op, _ = FORWARD_OP(q, k, None, True, "lse")
        dq, _ = qksoftmax.backward(q, k, a.dp)
    for out, expected in ((p, expected_p), (p_op, expected_p), (dq, expected_dq)):
        assert not out.requires_grad
        torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_inference_tensors_outside_inference_mode():
    """Tensors made in inference mode are valid inputs afterwards, as long as autograd need not save them."""
    with torch.inference_mode():
        a = valid()
    p = qksoftmax.attention_probs(a.q, a.k)
    assert not p.requires_grad
    dq, _ = qksoftmax.backward(a.q, a.k, a.dp, lse=a.lse)
    torch.testing.assert_close(dq, qksoftmax.backward(a.q.clone(), a.k.clone(), a.dp.clone())[0])


@pytest.mark.parametrize("save", ["lse", "p"])
def test_second_derivative_is_not_implemented(save):
    a = valid(dtype=torch.float64)
    q, k = (t.clone().requires_grad_(True) for t in (a.q, a.k))
    dq, dk = torch.autograd.grad(qksoftmax.attention_probs(q, k, save=save).sum(), (q, k), create_graph=True)
    with pytest.raises(NotImplementedError, match="no second derivative"):
        torch.autograd.grad(dq.sum() + dk.sum(), (q, k))


@requires_cuda
def test_ops_refuse_tensors_on_different_devices(cuda_backend):
    a = valid("cuda")
    with pytest.raises(ValueError, match="k: expected device cuda like q, got cpu"):
        FORWARD_OP(a.q, a.k.cpu(), None, True, "lse")
    with pytest.raises(ValueError, match="dp: expected device cuda like q, got cpu"):
        RECOMPUTE_OP(a.q, a.k, a.dp.cpu(), None, None, True)


@requires_cuda
@pytest.mark.parametrize("save", ["lse", "p"])
def test_out_of_memory(cuda_backend, save):
    """With the device's memory taken, attention_probs raises torch.OutOfMemoryError (its outputs are
    allocated before anything runs), its inputs unchanged; once the memory is back, the next call gives what a
    call gave before."""
    case = Case(1, 8, 8, 1024, 1024, 128)  # P: 16 MiB
    q, k = (t.requires_grad_(True) for t in tensors(3, torch.bfloat16, "cuda", case.q_shape, case.k_shape))
    expected = qksoftmax.attention_probs(q, k, save=save).detach()
    q_before, k_before = q.detach().clone(), k.detach().clone()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    hog = []
    chunk = 1 << 30
    while chunk >= 1 << 20:  # leaves less than 1 MiB of the device's memory
        try:
            hog.append(torch.empty(chunk, dtype=torch.uint8, device="cuda"))
        except torch.OutOfMemoryError:
            chunk //= 2
    try:
        with pytest.raises(torch.OutOfMemoryError):
            qksoftmax.attention_probs(q, k, save=save)
    finally:
        del hog
        torch.cuda.empty_cache()
    torch.testing.assert_close(q.detach(), q_before, rtol=0, atol=0)
    torch.testing.assert_close(k.detach(), k_before, rtol=0, atol=0)
    p = qksoftmax.attention_probs(q, k, save=save)
    torch.testing.assert_close(p.detach(), expected, rtol=0, atol=0)
    p.sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()


def test_numpy_broadcast_and_reversed_inputs():
    """numpy views torch cannot make: a read-only broadcast q (zero strides) and a k read backwards (negative
    strides, copied) give what their contiguous copies give."""
    q, k = (np.asarray(t) for t in tensors(4, torch.float32, "cpu", (1, 1, 4, CUDA_HEAD_DIM), (1, 2, 5, CUDA_HEAD_DIM)))
    q_broadcast = np.broadcast_to(q, (1, 2, 4, CUDA_HEAD_DIM))
    k_reversed = np.ascontiguousarray(k[:, :, ::-1])[:, :, ::-1]
    assert not q_broadcast.flags.writeable and k_reversed.strides[2] < 0
    p, lse = qksoftmax.forward(q_broadcast, k_reversed)
    p_ref, lse_ref = qksoftmax.forward(np.ascontiguousarray(q_broadcast), np.ascontiguousarray(k_reversed))
    np.testing.assert_array_equal(p, p_ref)
    np.testing.assert_array_equal(lse, lse_ref)
