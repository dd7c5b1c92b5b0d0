"""The numpy path (CPU backend) against the fp64 reference."""

import numpy as np
import pytest

import qk_reference as ref
import qksoftmax
from qk_reference import BACKWARD_MODES, TOLERANCE, Case, normal, rel_error, run_backward

CASES = [
    Case(1, 1, 1, 1, 1, 16),  # S = 1
    Case(2, 2, 2, 7, 7, 8),  # S = 7
    Case(1, 2, 1, 129, 129, 32),  # S = 129, GQA
    Case(1, 4, 2, 5, 9, 16),  # Sq < Sk, GQA
    Case(2, 3, 3, 12, 6, 4),  # Sq > Sk
]
DTYPES = [np.float16, np.float32, np.float64]


def inputs(case: Case, dtype, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    q, k, dp = normal(seed, case.q_shape, case.k_shape, case.p_shape)
    return q.astype(dtype), k.astype(dtype), dp.astype(dtype)


def check_backward(q, k, dp, mode: str, tolerance: float, **options) -> None:
    dq, dk = run_backward(q, k, dp, mode, **options)
    dq_ref, dk_ref = ref.backward(q, k, dp, **options)
    assert dq.shape == q.shape and dk.shape == k.shape
    assert dq.dtype == q.dtype and dk.dtype == q.dtype
    assert rel_error(dq, dq_ref) <= tolerance
    assert rel_error(dk, dk_ref) <= tolerance


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_forward(case, dtype, causal):
    q, k, _ = inputs(case, dtype, seed=1)
    p, lse = qksoftmax.forward(q, k, causal=causal)
    p_ref, lse_ref = ref.forward(q, k, causal=causal)
    assert isinstance(p, np.ndarray) and p.shape == case.p_shape and p.dtype == dtype
    assert lse.shape == case.p_shape[:-1] and lse.dtype == np.float32
    tolerance = TOLERANCE[np.dtype(dtype).name]
    assert rel_error(p, p_ref) <= tolerance
    assert rel_error(lse, lse_ref) <= TOLERANCE["float32"]


@pytest.mark.parametrize("mode", BACKWARD_MODES)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_backward(case, dtype, causal, mode):
    q, k, dp = inputs(case, dtype, seed=2)
    check_backward(q, k, dp, mode, TOLERANCE[np.dtype(dtype).name], causal=causal)


@pytest.mark.parametrize("scale", [0.25, 2])
def test_explicit_scale(scale):
    q, k, dp = inputs(Case(1, 2, 2, 9, 9, 8), np.float32, seed=3)
    p, _ = qksoftmax.forward(q, k, scale=scale)
    assert rel_error(p, ref.forward(q, k, scale=scale)[0]) <= TOLERANCE["float32"]
    check_backward(q, k, dp, "recompute", TOLERANCE["float32"], scale=scale)


def strided_inputs(case: Case, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """q laid out (B, S, H, D), k with every other element of D, dp transposed in memory."""
    q, k, dp = normal(seed, case.q_shape, case.k_shape, case.p_shape)
    q_bshd = np.ascontiguousarray(q.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
    k_wide = np.zeros(case.k_shape[:-1] + (2 * case.head_dim,), np.float32)
    k_wide[..., ::2] = k
    dp_t = np.ascontiguousarray(dp.swapaxes(-1, -2)).swapaxes(-1, -2)
    return q_bshd, k_wide[..., ::2], dp_t


@pytest.mark.parametrize("mode", BACKWARD_MODES)
def test_non_contiguous_inputs(mode):
    q, k, dp = strided_inputs(Case(2, 4, 2, 11, 13, 8), seed=4)
    assert not (q.flags.c_contiguous or k.flags.c_contiguous or dp.flags.c_contiguous)
    p, _ = qksoftmax.forward(q, k, causal=False)
    assert rel_error(p, ref.forward(q, k, causal=False)[0]) <= TOLERANCE["float32"]
    check_backward(q, k, dp, mode, TOLERANCE["float32"], causal=False)


def test_negative_strides_and_broadcasts():
    """Layouts the C++ API does not describe (negative strides) are copied; read-only broadcasts are not."""
    case = Case(1, 2, 2, 6, 6, 8)
    q, k, dp = normal(5, case.q_shape, case.k_shape, case.p_shape)
    q_reversed = q[:, :, ::-1]
    k_broadcast = np.broadcast_to(k[:, :1], case.k_shape)
    assert not k_broadcast.flags.writeable
    p, _ = qksoftmax.forward(q_reversed, k_broadcast)
    assert rel_error(p, ref.forward(q_reversed, k_broadcast)[0]) <= TOLERANCE["float32"]
    check_backward(q_reversed, k_broadcast, dp, "saved_p", TOLERANCE["float32"])


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_unaligned_arrays(dtype):
    """Arrays whose data is not aligned to their element size (a buffer viewed at an odd byte offset), contiguous
    or not, are copied to aligned memory: any layout works."""
    case = Case(1, 2, 1, 6, 7, 8)
    q, k, dp = (x.astype(dtype) for x in normal(7, case.q_shape, case.k_shape, case.p_shape))

    def unaligned(x: np.ndarray) -> np.ndarray:
        buffer = np.zeros(x.nbytes + 1, np.uint8)
        view = np.frombuffer(buffer, dtype=dtype, count=x.size, offset=1).reshape(x.shape)
        view[...] = x
        assert not view.flags.aligned
        return view

    q_u, dp_u = unaligned(q), unaligned(dp)
    k_u = unaligned(np.ascontiguousarray(k.swapaxes(-1, -2))).swapaxes(-1, -2)  # not contiguous either
    tolerance = TOLERANCE[np.dtype(dtype).name]
    p, _ = qksoftmax.forward(q_u, k_u)
    assert rel_error(p, ref.forward(q, k)[0]) <= tolerance
    for mode in BACKWARD_MODES:
        check_backward(q_u, k_u, dp_u, mode, tolerance)
    dq, dk = qksoftmax.backward(q_u, k_u, dp_u, p=unaligned(p))
    assert rel_error(dq, ref.backward(q, k, dp)[0]) <= tolerance


def test_masked_positions_are_never_read():
    case = Case(1, 2, 1, 8, 8, 8)
    q, k, dp = normal(6, case.q_shape, case.k_shape, case.p_shape)
    masked = ref.causal_mask(case.q_len, case.k_len)
    p, lse = qksoftmax.forward(q, k)
    p[..., masked] = np.nan
    dp[..., masked] = np.nan
    dq_ref, dk_ref = ref.backward(q, k, dp)
    for dq, dk in (qksoftmax.backward(q, k, dp), qksoftmax.backward(q, k, dp, lse=lse),
                   qksoftmax.backward(q, k, dp, p=p)):
        assert rel_error(dq, dq_ref) <= TOLERANCE["float32"]
        assert rel_error(dk, dk_ref) <= TOLERANCE["float32"]


def test_version():
    assert qksoftmax.__version__ == "0.1.0"
