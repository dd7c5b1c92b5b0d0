"""Every bad argument raises the right exception, naming the argument (numpy arrays; torch in its tests)."""

from types import SimpleNamespace

import numpy as np
import pytest

import qksoftmax
from qk_reference import Case, normal

CASE = Case(1, 2, 1, 4, 5, 8)


@pytest.fixture
def a() -> SimpleNamespace:
    """Valid float32 arguments, for a test to spoil one of."""
    q, k, dp = normal(0, CASE.q_shape, CASE.k_shape, CASE.p_shape)
    p, lse = qksoftmax.forward(q, k)
    return SimpleNamespace(q=q, k=k, dp=dp, p=p, lse=lse)


BAD_CALLS = {
    "q not an array": (lambda a: qksoftmax.forward(a.q.tolist(), a.k), TypeError,
                       "qksoftmax.forward: q must be a torch.Tensor or numpy.ndarray, got list"),
    "q complex64": (lambda a: qksoftmax.forward(a.q.astype(np.complex64), a.k), TypeError,
                    "q must have dtype float16, float32 or float64 (numpy has no bfloat16), got complex64"),
    "q int32": (lambda a: qksoftmax.backward(a.q.astype(np.int32), a.k, a.dp), TypeError,
                "qksoftmax.backward: q must have dtype"),
    "k not an array": (lambda a: qksoftmax.forward(a.q, None), TypeError,
                       "k must be a numpy.ndarray like q, got NoneType"),
    "k other dtype": (lambda a: qksoftmax.forward(a.q, a.k.astype(np.float16)), TypeError,
                      "k must have dtype float32 like q, got float16"),
    "q rank 3": (lambda a: qksoftmax.forward(a.q[0], a.k), ValueError,
                 "q must have shape (B, Hq, Sq, D) with sizes >= 1, got (2, 4, 8)"),
    "q empty": (lambda a: qksoftmax.forward(a.q[:, :, :0], a.k), ValueError, "q must have shape"),
    "k rank 5": (lambda a: qksoftmax.forward(a.q, a.k[None]), ValueError, "k must have shape (B, Hk, Sk, D)"),
    "k other D": (lambda a: qksoftmax.forward(a.q, a.k[..., :4]), ValueError, "k must have shape"),
    "k other B": (lambda a: qksoftmax.forward(a.q, np.concatenate([a.k, a.k])), ValueError, "k must have shape"),
    "Hk not dividing Hq": (lambda a: qksoftmax.forward(a.q[:, :1], np.concatenate([a.k, a.k], axis=1)),
                           ValueError, "Hk dividing Hq"),
    "dp other dtype": (lambda a: qksoftmax.backward(a.q, a.k, a.dp.astype(np.float16)), TypeError,
                       "qksoftmax.backward: dp must have dtype float32 like q, got float16"),
    "dp other shape": (lambda a: qksoftmax.backward(a.q, a.k, a.dp[..., :3]), ValueError,
                       "dp must have shape (B, Hq, Sq, Sk) = (1, 2, 4, 5), got (1, 2, 4, 3)"),
    "dp not an array": (lambda a: qksoftmax.backward(a.q, a.k, 1.0), TypeError, "dp must be a numpy.ndarray"),
    "p other dtype": (lambda a: qksoftmax.backward(a.q, a.k, a.dp, p=a.p.astype(np.float16)), TypeError,
                      "p must have dtype float32 like q"),
    "p other shape": (lambda a: qksoftmax.backward(a.q, a.k, a.dp, p=a.p[:, :1]), ValueError, "p must have shape"),
    "lse float16": (lambda a: qksoftmax.backward(a.q, a.k, a.dp, lse=a.lse.astype(np.float16)), TypeError,
                    "lse must have dtype float32, got float16"),
    "lse other shape": (lambda a: qksoftmax.backward(a.q, a.k, a.dp, lse=a.lse[..., None]), ValueError,
                        "lse must have shape (B, Hq, Sq) = (1, 2, 4)"),
    "scale str": (lambda a: qksoftmax.forward(a.q, a.k, scale="0.5"), TypeError,
                  "scale must be a real number or None, got str"),
    "scale bool": (lambda a: qksoftmax.forward(a.q, a.k, scale=True), TypeError, "scale must be a real number"),
    "scale nan": (lambda a: qksoftmax.backward(a.q, a.k, a.dp, scale=float("nan")), ValueError,
                  "scale must be finite and within float32 range, got nan"),
    "scale huge": (lambda a: qksoftmax.forward(a.q, a.k, scale=1e39), ValueError, "scale must be finite"),
    "causal int": (lambda a: qksoftmax.forward(a.q, a.k, causal=1), TypeError, "causal must be a bool, got int"),
    "attention_probs on numpy": (lambda a: qksoftmax.attention_probs(a.q, a.k), TypeError,
                                 "qksoftmax.attention_probs: q must be a torch.Tensor, got numpy.ndarray"),
}


@pytest.mark.parametrize("name", BAD_CALLS)
def test_bad_argument(a, name):
    call, error, message = BAD_CALLS[name]
    with pytest.raises(error) as raised:
        call(a)
    assert message in str(raised.value)


def test_extension_reports_invalid_argument_as_value_error(a):
    """A Status of kInvalidArgument from the C++ API becomes ValueError, its message kept."""
    p_too_small = np.empty(CASE.p_shape[:-1] + (1,), np.float32)
    with pytest.raises(ValueError, match=r"^p: expected shape"):
        qksoftmax._C.plan_forward(a.q, a.k, p_too_small, None, None, True)


def test_extension_rejects_unknown_dtype(a):
    with pytest.raises(TypeError, match="q must have dtype bfloat16, float16, float32 or float64"):
        qksoftmax._C.plan_forward(a.q.astype(np.int32), a.k, a.p, None, None, True)


def test_extension_rejects_a_read_only_output(a):
    p = np.empty_like(a.p)
    p.flags.writeable = False
    with pytest.raises(TypeError, match="p must be a torch.Tensor or an array .*, writable, got ndarray"):
        qksoftmax._C.plan_forward(a.q, a.k, p, None, None, True)


def test_a_refused_call_writes_nothing(a):
    """A plan refused by the C++ API launched nothing: the outputs keep their bytes."""
    dq, dk = np.full_like(a.q, 7.0), np.full_like(a.k, 7.0)
    with pytest.raises(ValueError, match="^dp: expected shape"):
        qksoftmax._C.plan_backward(a.q, a.k, a.dp[..., :3], None, None, dq, dk, None, True)
    assert (dq == 7.0).all() and (dk == 7.0).all()
