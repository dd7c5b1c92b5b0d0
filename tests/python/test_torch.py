"""torch tensors: CPU (CPU backend) and CUDA, against the fp64 reference and pure PyTorch autograd."""

import pytest

import qk_reference as ref
import qksoftmax
from qk_reference import BACKWARD_MODES, CUDA_HEAD_DIM, TOLERANCE, Case, normal, rel_error, run_backward

torch = pytest.importorskip("torch")

from torch_util import (  # noqa: E402  (after the skip: torch_util imports torch)
    DTYPES,
    HAS_CUDA,
    requires_cuda,
    tensors,
    to_numpy,
    tolerance,
    torch_probs,
)

requires_two_gpus = pytest.mark.skipif(not HAS_CUDA or torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")

CASES = [
    Case(1, 2, 2, 1, 1, CUDA_HEAD_DIM),  # S = 1
    Case(2, 2, 2, 7, 7, CUDA_HEAD_DIM),  # S = 7
    Case(1, 4, 2, 129, 129, CUDA_HEAD_DIM),  # S = 129, GQA
    Case(1, 2, 1, 33, 70, 2 * CUDA_HEAD_DIM),  # Sq < Sk, GQA
]


def check_backward(q, k, dp, mode: str, **options) -> None:
    dq, dk = run_backward(q, k, dp, mode, **options)
    dq_ref, dk_ref = ref.backward(to_numpy(q), to_numpy(k), to_numpy(dp), **options)
    for out, like in ((dq, q), (dk, k)):
        assert isinstance(out, torch.Tensor)
        assert out.shape == like.shape and out.dtype == like.dtype and out.device == like.device
    assert rel_error(to_numpy(dq), dq_ref) <= tolerance(q.dtype)
    assert rel_error(to_numpy(dk), dk_ref) <= tolerance(q.dtype)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_forward(device, dtype, case, causal):
    q, k = tensors(1, dtype, device, case.q_shape, case.k_shape)
    p, lse = qksoftmax.forward(q, k, causal=causal)
    assert p.shape == case.p_shape and p.dtype == dtype and p.device == q.device
    assert lse.shape == case.p_shape[:-1] and lse.dtype == torch.float32 and lse.device == q.device
    p_ref, lse_ref = ref.forward(to_numpy(q), to_numpy(k), causal=causal)
    assert rel_error(to_numpy(p), p_ref) <= tolerance(dtype)
    assert rel_error(to_numpy(lse), lse_ref) <= TOLERANCE["float32"]


@pytest.mark.parametrize("mode", BACKWARD_MODES)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_backward(device, dtype, case, causal, mode):
    q, k, dp = tensors(2, dtype, device, case.q_shape, case.k_shape, case.p_shape)
    check_backward(q, k, dp, mode, causal=causal)


@pytest.mark.parametrize("mode", BACKWARD_MODES)
def test_any_layout(device, mode):
    """q laid out (B, S, H, D), k and dp with the last dimension strided (copied on CUDA only)."""
    case = Case(2, 4, 2, 17, 17, CUDA_HEAD_DIM)
    q_bshd, k_wide, dp_t = tensors(3, torch.float32, device, (2, 17, 4, CUDA_HEAD_DIM),
                                   (2, 2, 17, 2 * CUDA_HEAD_DIM), (2, 4, 17, 17))
    q, k, dp = q_bshd.transpose(1, 2), k_wide[..., ::2], dp_t.transpose(-1, -2)
    assert q.shape == case.q_shape and k.stride(-1) == 2 and dp.stride(-1) != 1
    check_backward(q, k, dp, mode)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [True, False])
def test_attention_probs_gradients(device, dtype, causal):
    case = Case(2, 4, 2, 19, 23, CUDA_HEAD_DIM)
    q, k = tensors(4, dtype, device, case.q_shape, case.k_shape)
    weight = tensors(5, dtype, device, (case.k_len, case.q_len))[0].t()  # dp strided: last stride != 1
    q.requires_grad_(True)
    k.requires_grad_(True)
    p = qksoftmax.attention_probs(q, k, causal=causal)
    (p * weight).sum().backward()

    q64, k64 = (t.detach().cpu().double().requires_grad_(True) for t in (q, k))
    p64 = torch_probs(q64, k64, causal)
    (p64 * weight.cpu().double()).sum().backward()
    for out, expected in ((p, p64), (q.grad, q64.grad), (k.grad, k64.grad)):
        assert out.dtype == dtype and out.device == q.device
        assert rel_error(to_numpy(out), to_numpy(expected)) <= tolerance(dtype)


def test_requires_grad_inputs_outside_autograd(device):
    q, k, dp = (t.requires_grad_(True) for t in tensors(6, torch.float32, device, (1, 1, 5, 64),
                                                        (1, 1, 5, 64), (1, 1, 5, 5)))
    p, _ = qksoftmax.forward(q, k)
    dq, _ = qksoftmax.backward(q, k, dp)
    assert not p.requires_grad and not dq.requires_grad


@requires_cuda
def test_runs_on_the_current_stream(cuda_backend):
    """A CUDA graph capture fails on any work outside the capturing (current) stream."""
    case = Case(1, 2, 2, 64, 64, CUDA_HEAD_DIM)
    q, k, dp = tensors(7, torch.bfloat16, "cuda", case.q_shape, case.k_shape, case.p_shape)
    qksoftmax.forward(q, k)  # warm-up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        p, lse = qksoftmax.forward(q, k)
        dq, dk = qksoftmax.backward(q, k, dp, lse=lse)
    graph.replay()
    torch.cuda.synchronize()
    dq_ref, _ = ref.backward(to_numpy(q), to_numpy(k), to_numpy(dp))
    assert rel_error(to_numpy(p), ref.forward(to_numpy(q), to_numpy(k))[0]) <= tolerance(torch.bfloat16)
    assert rel_error(to_numpy(dq), dq_ref) <= tolerance(torch.bfloat16)


@requires_two_gpus
def test_second_device(cuda_backend):
    case = Case(1, 2, 2, 9, 9, CUDA_HEAD_DIM)
    q, k = tensors(8, torch.float32, "cuda:1", case.q_shape, case.k_shape)
    p, _ = qksoftmax.forward(q, k)
    assert p.device == q.device
    assert rel_error(to_numpy(p), ref.forward(to_numpy(q), to_numpy(k))[0]) <= TOLERANCE["float32"]
    with pytest.raises(ValueError, match="k must be on cuda:1 like q, got cuda:0"):
        qksoftmax.forward(q, k.to("cuda:0"))


def test_dtype_mismatch_names_both_dtypes():
    q, k, dp = tensors(9, torch.bfloat16, "cpu", (1, 1, 4, 8), (1, 1, 4, 8), (1, 1, 4, 4))
    message = "qksoftmax.backward: dp must have dtype torch.bfloat16 like q, got torch.float32"
    with pytest.raises(TypeError, match=message):
        qksoftmax.backward(q, k, dp.float())


def test_unsupported_dtype():
    q = torch.zeros(1, 1, 4, 8, dtype=torch.int32)
    message = "q must have dtype torch.bfloat16, torch.float16, torch.float32 or torch.float64, got torch.int32"
    with pytest.raises(TypeError, match=message):
        qksoftmax.forward(q, q)


@pytest.mark.parametrize("mode", BACKWARD_MODES)
@pytest.mark.parametrize("causal", [True, False])
def test_float64_on_the_cpu(causal, mode):
    """fp64 runs on the CPU backend; only lse is float32, and recompute mode given it is still fp64-accurate."""
    case = CASES[-1]
    q, k, dp = tensors(12, torch.float64, "cpu", case.q_shape, case.k_shape, case.p_shape)
    p, lse = qksoftmax.forward(q, k, causal=causal)
    assert p.dtype == torch.float64 and lse.dtype == torch.float32
    assert rel_error(to_numpy(p), ref.forward(to_numpy(q), to_numpy(k), causal=causal)[0]) <= TOLERANCE["float64"]
    check_backward(q, k, dp, mode, causal=causal)


@requires_cuda
def test_float64_on_cuda_is_not_implemented():
    q = torch.zeros(1, 1, 4, CUDA_HEAD_DIM, dtype=torch.float64, device="cuda")
    message = "q has dtype torch.float64 on cuda:0: float64 runs on the CPU backend only"
    with pytest.raises(NotImplementedError, match=message):
        qksoftmax.forward(q, q)
    p = torch.zeros(1, 1, 4, 4, dtype=torch.float64, device="cuda")
    with pytest.raises(NotImplementedError, match="^q: float64 runs on the CPU backend only$"):
        qksoftmax._C.plan_forward(q, q, p, None, None, True)


def test_mixing_numpy_and_torch():
    q, k = normal(10, (1, 1, 4, 8), (1, 1, 4, 8))
    with pytest.raises(TypeError, match="k must be a torch.Tensor like q, got numpy.ndarray"):
        qksoftmax.forward(torch.from_numpy(q), k)
    with pytest.raises(TypeError, match="k must be a numpy.ndarray like q, got torch.Tensor"):
        qksoftmax.forward(q, torch.from_numpy(k))
    with pytest.raises(TypeError, match="qksoftmax.attention_probs: k must be a torch.Tensor like q"):
        qksoftmax.attention_probs(torch.from_numpy(q), k)


def test_unsupported_device():
    q = torch.zeros(1, 1, 4, 8, device="meta")
    with pytest.raises(ValueError, match="q must be on the CPU or a CUDA device, got meta"):
        qksoftmax.forward(q, q)


@requires_cuda
def test_tensors_on_different_devices():
    q, k = tensors(11, torch.float32, "cuda", (1, 1, 4, 8), (1, 1, 4, 8))
    with pytest.raises(ValueError, match="k must be on cuda:0 like q, got cpu"):
        qksoftmax.forward(q, k.cpu())
    with pytest.raises(ValueError, match="dp must be on cuda:0 like q, got cpu"):
        qksoftmax.backward(q, k, torch.zeros(1, 1, 4, 4))


@requires_cuda
def test_unsupported_head_dim_is_not_implemented():
    q = torch.zeros(1, 1, 4, 1000, device="cuda")
    with pytest.raises(NotImplementedError):
        qksoftmax.forward(q, q)
