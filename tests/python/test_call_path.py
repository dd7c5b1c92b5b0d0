"""The call path stays lean: each call validates once (the C++ API's validation, counted by qksoftmax._C.counters()),
describes each tensor argument once, asks the CUDA driver nothing about a framework's tensors, and runs the
Python checks only to phrase a refused call's error. On the CPU (numpy always, torch where installed) and on CUDA."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import numpy as np
import pytest

import qksoftmax
from qksoftmax import _C, _core
from qk_reference import CUDA_HEAD_DIM, Case, normal

CASE = Case(2, 4, 2, 5, 7, 8)


@contextlib.contextmanager
def counted() -> Iterator[dict[str, int]]:
    """What the calls inside the block cost, by _C.counters()."""
    spent: dict[str, int] = {}
    before = _C.counters()
    yield spent
    after = _C.counters()
    spent.update({name: after[name] - before[name] for name in before})


@pytest.fixture
def checks_forbidden(monkeypatch):
    """The Python checks fail the test if a call that succeeds runs them."""

    def forbidden(*args, **kwargs):
        raise AssertionError("a call that succeeds ran the Python checks")

    monkeypatch.setattr(_core, "check_forward", forbidden)
    monkeypatch.setattr(_core, "check_backward", forbidden)


def numpy_inputs() -> tuple[np.ndarray, ...]:
    q, k, dp = normal(0, CASE.q_shape, CASE.k_shape, CASE.p_shape)
    return q, k, dp


# (call, tensors it passes to the C++ API) for each way of calling forward and backward.
def numpy_calls() -> dict[str, tuple[Callable[[], object], int]]:
    q, k, dp = numpy_inputs()
    p, lse = qksoftmax.forward(q, k)
    return {
        "forward": (lambda: qksoftmax.forward(q, k), 4),
        "backward recompute": (lambda: qksoftmax.backward(q, k, dp), 5),
        "backward recompute_lse": (lambda: qksoftmax.backward(q, k, dp, lse=lse), 6),
        "backward saved_p": (lambda: qksoftmax.backward(q, k, dp, p=p), 6),
    }


@pytest.mark.parametrize("name", list(numpy_calls()))
def test_numpy_call_validates_once(name, checks_forbidden):
    call, tensors = numpy_calls()[name]
    with counted() as spent:
        call()
    assert spent == {"validations": 1, "conversions": tensors, "pointer_queries": 0}


def test_a_refused_call_runs_the_checks(monkeypatch):
    """The checks run when the C++ API refuses a call, and their message names the argument."""
    q, k, _ = numpy_inputs()
    seen = []
    check = _core.check_forward
    monkeypatch.setattr(_core, "check_forward", lambda *args: seen.append(1) or check(*args))
    with pytest.raises(ValueError, match="qksoftmax.forward: k must have shape"):
        qksoftmax.forward(q, k[:, :, :, :3])
    assert seen == [1]


def test_a_refusal_the_checks_cannot_explain_stands():
    """An output the C++ API refuses for its memory (it overlaps an input) is no argument error the Python
    checks know: the C++ API's message stands."""
    q, k, dp = numpy_inputs()
    with pytest.raises(ValueError, match="^p: expected an output whose memory does not overlap q's"):
        _C.plan_forward(q, k, q.reshape(-1)[: dp.size].reshape(dp.shape), None, None, True)


torch_calls_params = ["forward", "backward recompute_lse", "backward saved_p", "ops forward", "attention_probs",
                      "attention_probs no grad"]


def torch_calls(torch, device: str) -> dict[str, tuple[Callable[[], object], int, int]]:
    """(call, validations, conversions) per way of calling qksoftmax on torch tensors."""
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    head_dim = CUDA_HEAD_DIM if device == "cuda" else CASE.head_dim
    q, k, dp = (
        torch.from_numpy(x).to(device=device, dtype=dtype)
        for x in normal(1, CASE.q_shape[:-1] + (head_dim,), CASE.k_shape[:-1] + (head_dim,), CASE.p_shape)
    )
    p, lse = qksoftmax.forward(q, k)
    qg, kg = q.clone().requires_grad_(True), k.clone().requires_grad_(True)

    def attention_probs() -> object:
        return torch.autograd.grad(qksoftmax.attention_probs(qg, kg), (qg, kg), dp)

    return {
        "forward": (lambda: qksoftmax.forward(q, k), 1, 4),
        "backward recompute_lse": (lambda: qksoftmax.backward(q, k, dp, lse=lse), 1, 6),
        "backward saved_p": (lambda: qksoftmax.backward(q, k, dp, p=p), 1, 6),
        "ops forward": (lambda: torch.ops.qksoftmax.forward(q, k, None, True, "lse"), 1, 4),
        "attention_probs": (attention_probs, 2, 4 + 6),
        "attention_probs no grad": (lambda: qksoftmax.attention_probs(q, k), 1, 4),
    }


@pytest.mark.parametrize("name", torch_calls_params)
def test_torch_call_validates_once(device, name, checks_forbidden):
    torch = pytest.importorskip("torch")
    call, validations, conversions = torch_calls(torch, device)[name]
    call()  # the first call may load what later calls reuse
    with counted() as spent:
        call()
    assert spent == {"validations": validations, "conversions": conversions, "pointer_queries": 0}


def test_an_op_refuses_a_wrong_rank_naming_the_argument():
    """The ops take the C++ API's message as it is: q or k without the dimensions p is made of is a ValueError
    that names it, not an IndexError of the allocation."""
    torch = pytest.importorskip("torch")
    q, k = torch.ones(4, 4), torch.ones(1, 1, 4, 4)
    with pytest.raises(ValueError, match=r"^q: expected rank 4 \(B, Hq, Sq, D\), got rank 2"):
        torch.ops.qksoftmax.forward(q, k, None, True, "lse")
    with pytest.raises(ValueError, match=r"^k: expected rank 4 \(B, Hk, Sk, D\), got rank 2"):
        torch.ops.qksoftmax.forward(k, q, None, True, "lse")


def test_plain_eager_tells_what_may_skip_the_ops():
    """Plain tensors (torch.Tensor, nn.Parameter) outside any mode or transform skip the ops; a subclass, a
    torch-function or dispatch mode, or vmap does not, and the fused calls then return None without running."""
    torch = pytest.importorskip("torch")
    from torch.utils._python_dispatch import TorchDispatchMode

    class Sub(torch.Tensor):
        pass

    q = torch.ones(1, 1, 4, 4)
    sub = q.as_subclass(Sub)
    param = torch.nn.Parameter(q.clone())
    assert _C.plain_eager(q, param) and _C.plain_eager(q, None)
    assert not _C.plain_eager(q, sub) and not _C.plain_eager(sub, q)
    with counted() as spent:
        assert _C.torch_forward(q, sub, None, True, True) is None
        assert _C.torch_backward(q, q, q, None, sub, None, True, True) is None
    assert spent["validations"] == 0 and spent["conversions"] == 0
    with torch.overrides.TorchFunctionMode():
        assert not _C.plain_eager(q, q)
        assert _C.torch_forward(q, q, None, True, True) is None
    with TorchDispatchMode():
        assert not _C.plain_eager(q, q)
    seen = []
    torch.vmap(lambda x: seen.append(_C.plain_eager(x, x)) or x)(q)
    assert seen == [False]
    p, lse = _C.torch_forward(q, q, None, True, True)
    assert p.shape == (1, 1, 4, 4) and lse.shape == (1, 1, 4)


def test_plain_tensors_and_subclasses_are_described_alike():
    """A plain tensor is described by one DLPack export, any other tensor by its attributes: the two give the
    same description (data pointer, shape, strides, dtype), so the same results bit for bit, for views with
    offsets, transposed and size-1 dimensions with any stride, and a broadcast (stride 0) key head (CPU)."""
    torch = pytest.importorskip("torch")

    class Sub(torch.Tensor):
        pass

    generator = torch.Generator().manual_seed(0)

    def randn(*size: int) -> object:
        return torch.randn(*size, dtype=torch.float64, generator=generator)

    q_base, dp_base = randn(2, 4, 7, 10), randn(2, 4, 7, 8)
    cases = {
        "contiguous": (randn(2, 4, 6, 8), randn(2, 2, 5, 8), randn(2, 4, 6, 5)),
        "views": (q_base[:, 1:3, 1:, 2:], randn(2, 1, 8, 5).transpose(-1, -2).expand(2, 2, 5, 8),
                  dp_base[:, 1:3, 1:, 2:7]),
        "size-1 dimensions": (q_base[:1, 2:3, :, 2:], randn(1, 3, 8, 9)[:, 1:2, :, 2:7].transpose(-1, -2),
                              dp_base[:1, 2:3, :, 1:6]),
    }
    for name, (q, k, dp) in cases.items():
        _, lse = _C.torch_forward(q, k, None, True)
        plain = (*_C.torch_forward(q, k, 0.5, True), *_C.torch_backward(q, k, dp, None, lse, None, True))
        subs = [x.as_subclass(Sub) for x in (q, k, dp, lse)]
        other = (*_C.torch_forward(subs[0], subs[1], 0.5, True),
                 *_C.torch_backward(subs[0], subs[1], subs[2], None, subs[3], None, True))
        for a, b in zip(plain, other):
            assert type(a) is torch.Tensor and type(b) is torch.Tensor, name
            assert torch.equal(a, b), name


def test_outputs_are_plain_contiguous_tensors_on_q_device():
    """The fused calls allocate each output on q's device (q.new_empty on a plain q, torch.empty on any other):
    a plain, contiguous torch.Tensor that does not require grad, of q's dtype (the LSE float32), whatever q is."""
    torch = pytest.importorskip("torch")

    class Sub(torch.Tensor):
        pass

    q = torch.nn.Parameter(torch.randn(1, 2, 3, 4, dtype=torch.float64).transpose(-1, -2).contiguous()
                           .transpose(-1, -2))
    k = torch.randn(1, 1, 5, 4, dtype=torch.float64)
    dp = torch.randn(1, 2, 3, 5, dtype=torch.float64)
    for query in (q, q.detach().as_subclass(Sub)):
        p, lse = _C.torch_forward(query, k, None, True)
        dq, dk = _C.torch_backward(query, k, dp, None, lse, None, True)
        for out, shape, dtype in ((p, (1, 2, 3, 5), torch.float64), (lse, (1, 2, 3), torch.float32),
                                  (dq, (1, 2, 3, 4), torch.float64), (dk, (1, 1, 5, 4), torch.float64)):
            assert type(out) is torch.Tensor and out.shape == shape and out.dtype == dtype
            assert out.is_contiguous() and not out.requires_grad and out.device == q.device
