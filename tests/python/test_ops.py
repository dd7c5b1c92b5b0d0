"""The torch custom ops (torch.ops.qksoftmax) and attention_probs: opcheck, fp64 gradcheck, a model-shaped block
in eager mode and under torch.compile, the incoming gradient left alone, CUDA-graph capture and replay."""

import contextlib
import copy

import pytest

import qksoftmax
from qk_reference import CUDA_HEAD_DIM, Case, rel_error

torch = pytest.importorskip("torch")

import torch._dynamo.testing  # noqa: E402
from torch_util import (  # noqa: E402  (after the skip: torch_util imports torch)
    DTYPES,
    requires_cuda,
    tensors,
    to_numpy,
    tolerance,
    torch_probs,
)

SAVES = ["lse", "p"]
CPU_HEAD_DIM = 8  # the CPU backend takes any head dimension: small keeps the CPU suite fast
# Inductor on the CPU spends half a minute compiling C++ for the block's own layers; the custom ops are the
# same opaque calls under every backend, and aot_eager traces them just as far (fake tensors, autograd).
COMPILE_BACKENDS = {"cpu": "aot_eager", "cuda": "inductor"}


def head_dim(device: str) -> int:
    return CUDA_HEAD_DIM if device == "cuda" else CPU_HEAD_DIM


def leaves(*ts: torch.Tensor) -> list[torch.Tensor]:
    return [t.detach().requires_grad_(True) for t in ts]


def op_samples(device: str) -> dict:
    """Arguments for each op: GQA, Sq != Sk, both masks, default and explicit scale."""
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    case = Case(2, 4, 2, 9, 13, head_dim(device))
    q, k, dp = tensors(1, dtype, device, case.q_shape, case.k_shape, case.p_shape)
    p, lse = qksoftmax.forward(q, k)
    p_full, _ = qksoftmax.forward(q, k, scale=0.5, causal=False)
    return {
        torch.ops.qksoftmax.forward: [(*leaves(q, k), None, True, "lse"), (*leaves(q, k), 0.5, False, "p")],
        torch.ops.qksoftmax.backward_recompute: [(q, k, dp, lse, None, True), (q, k, dp, None, 0.5, False)],
        torch.ops.qksoftmax.backward_saved_p: [(q, k, p, dp, None, True), (q, k, p_full, dp, 0.5, False)],
    }


@pytest.mark.parametrize("op", ["forward", "backward_recompute", "backward_saved_p"])
def test_opcheck(device, op):
    packet = getattr(torch.ops.qksoftmax, op)
    for args in op_samples(device)[packet]:
        torch.library.opcheck(packet.default, args)


GRADCHECK_CASES = [
    Case(1, 2, 2, 5, 5, 3),
    Case(1, 4, 2, 4, 6, 3),  # GQA, Sq < Sk
    Case(2, 2, 1, 6, 3, 2),  # GQA, Sq > Sk
]


@pytest.mark.parametrize("save", SAVES)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("case", GRADCHECK_CASES, ids=str)
def test_gradcheck_float64(case, causal, save):
    """Through the CPU backend, fp64 all the way but for lse (float32, well within gradcheck's tolerance)."""
    q, k = leaves(*tensors(2, torch.float64, "cpu", case.q_shape, case.k_shape))
    assert torch.autograd.gradcheck(
        lambda q, k: qksoftmax.attention_probs(q, k, causal=causal, save=save), (q, k)
    )


@pytest.mark.parametrize("save", SAVES)
def test_what_the_forward_keeps(save):
    case = Case(1, 2, 1, 4, 5, CPU_HEAD_DIM)
    q, k = leaves(*tensors(3, torch.float32, "cpu", case.q_shape, case.k_shape))
    p = qksoftmax.attention_probs(q, k, save=save)
    *inputs, kept = p.grad_fn.saved_tensors
    assert [t.shape for t in inputs] == [q.shape, k.shape]
    assert kept.shape == (case.p_shape if save == "p" else case.p_shape[:-1])


def test_bad_save():
    q = torch.zeros(1, 1, 4, CPU_HEAD_DIM)
    with pytest.raises(ValueError, match="qksoftmax.attention_probs: save must be 'p' or 'lse', got 'P'"):
        qksoftmax.attention_probs(q, q, save="P")


@pytest.mark.parametrize("save", SAVES)
def test_incoming_gradient_is_not_written(device, save):
    case = Case(2, 4, 2, 17, 17, head_dim(device))
    q, k, dp = tensors(4, torch.float32, device, case.q_shape, case.k_shape, case.p_shape)
    q, k = leaves(q, k)
    before = dp.clone()
    qksoftmax.attention_probs(q, k, save=save).backward(dp)
    assert torch.equal(dp, before)
    assert q.grad is not None and k.grad is not None


class AttentionBlock(torch.nn.Module):
    """x → q, k, v projections (k and v with fewer heads: GQA) → P = probs(q, k) → P v → output projection."""

    def __init__(self, probs, width: int, heads: int, kv_heads: int, head_dim: int) -> None:
        super().__init__()
        self.probs = probs
        self.heads, self.kv_heads = heads, kv_heads
        self.q = torch.nn.Linear(width, heads * head_dim, bias=False)
        self.k = torch.nn.Linear(width, kv_heads * head_dim, bias=False)
        self.v = torch.nn.Linear(width, kv_heads * head_dim, bias=False)
        self.out = torch.nn.Linear(heads * head_dim, width, bias=False)

    def split(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        """(B, S, heads · D) → (B, heads, S, D), a strided view."""
        return x.unflatten(-1, (heads, -1)).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.split(self.q(x), self.heads)
        k = self.split(self.k(x), self.kv_heads)
        v = self.split(self.v(x), self.kv_heads).repeat_interleave(self.heads // self.kv_heads, dim=1)
        p = self.probs(q, k)
        return self.out((p @ v).transpose(1, 2).flatten(-2))


def block_results(block: torch.nn.Module, x: torch.Tensor, target: torch.Tensor) -> list[torch.Tensor]:
    """The block's output, and the gradients of x and of every weight, of an MSE loss."""
    x = x.detach().requires_grad_(True)
    out = block(x)
    (out.double() - target).square().mean().backward()
    return [out, x.grad] + [w.grad for w in block.parameters()]


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize(
    ("device", "dtype"),
    [("cpu", torch.float32)] + [pytest.param("cuda", dtype, marks=requires_cuda) for dtype in DTYPES],
    ids=str,
)
def test_attention_block(request, device, dtype, compiled):
    """qksoftmax in a model matches the pure-PyTorch block: within the accuracy bar (docs/SPEC.md) of the fp64 block, or
    no worse than twice PyTorch's own error in the same dtype (errors compound through the projections)."""
    if device == "cuda":
        request.getfixturevalue("cuda_backend")
    batch, seq, heads, kv_heads, dim = 2, 33, 4, 2, head_dim(device)
    width = heads * dim
    torch.manual_seed(5)
    torch_block = AttentionBlock(torch_probs, width, heads, kv_heads, dim).to(device=device, dtype=dtype)
    reference = copy.deepcopy(torch_block).to(device="cpu", dtype=torch.float64)
    ours = copy.deepcopy(torch_block)
    ours.probs = qksoftmax.attention_probs
    if compiled:
        ours = torch.compile(ours, fullgraph=True, backend=COMPILE_BACKENDS[device])
    x, target = tensors(6, dtype, device, (batch, seq, width), (batch, seq, width))
    target = target.double()
    expected = block_results(reference, x.cpu().double(), target.cpu())
    for name, got, baseline, ref in zip(
        ["out", "x.grad", "q.weight.grad", "k.weight.grad", "v.weight.grad", "out.weight.grad"],
        block_results(ours, x, target),
        block_results(torch_block, x, target),
        expected,
    ):
        bound = max(tolerance(dtype), 2 * rel_error(to_numpy(baseline), to_numpy(ref)))
        assert rel_error(to_numpy(got), to_numpy(ref)) <= bound, name


def scores_loss(q: torch.Tensor, k: torch.Tensor, weight: torch.Tensor, save: str = "lse") -> torch.Tensor:
    return (qksoftmax.attention_probs(q, k, save=save) * weight).sum()


def loss_and_gradients(loss_fn, q: torch.Tensor, k: torch.Tensor, *args) -> list[torch.Tensor]:
    q, k = leaves(q, k)
    loss = loss_fn(q, k, *args)
    return [loss, *torch.autograd.grad(loss, (q, k))]


def test_compile_dynamic_shapes_in_one_graph():
    """fullgraph=True: no graph break; dynamic=True: new sequence lengths and batch sizes reuse the graph."""
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(scores_loss, backend=counter, fullgraph=True, dynamic=True)
    for seed, case in enumerate([Case(2, 6, 3, 5, 7, CPU_HEAD_DIM), Case(4, 6, 3, 9, 11, CPU_HEAD_DIM)]):
        args = tensors(seed, torch.float32, "cpu", case.q_shape, case.k_shape, case.p_shape)
        for got, expected in zip(loss_and_gradients(compiled, *args), loss_and_gradients(scores_loss, *args)):
            torch.testing.assert_close(got, expected)
    assert counter.frame_count == 1


def test_compile_inductor_on_the_cpu():
    """The inductor backend compiles the code around the ops (C++ on the CPU): same loss and gradients."""
    case = Case(1, 2, 1, 6, 7, CPU_HEAD_DIM)
    args = tensors(14, torch.float32, "cpu", case.q_shape, case.k_shape, case.p_shape)
    compiled = torch.compile(scores_loss, backend="inductor", fullgraph=True)
    for got, expected in zip(loss_and_gradients(compiled, *args), loss_and_gradients(scores_loss, *args)):
        torch.testing.assert_close(got, expected)


def forward_and_backward(q: torch.Tensor, k: torch.Tensor, dp: torch.Tensor) -> tuple[torch.Tensor, ...]:
    p, lse = qksoftmax.forward(q, k, causal=False)
    recomputed = qksoftmax.backward(q, k, dp, lse=lse, causal=False)
    return (p, lse, *recomputed, *qksoftmax.backward(q, k, dp, p=p, causal=False))


def test_compile_forward_and_backward():
    """qksoftmax.forward and backward on torch tensors are the custom ops: they compile without a break."""
    case = Case(1, 2, 1, 6, 6, CPU_HEAD_DIM)
    args = tensors(7, torch.float32, "cpu", case.q_shape, case.k_shape, case.p_shape)
    compiled = torch.compile(forward_and_backward, backend="aot_eager", fullgraph=True)
    for got, expected in zip(compiled(*args), forward_and_backward(*args)):
        torch.testing.assert_close(got, expected)


# The eager fast path (plain tensors, no mode: _ops.plain_eager and its inline form): plain eager calls skip the
# ops' dispatcher and must give what the ops give; anything the ops exist for (fake tensors, dispatch modes,
# double backward) must still reach them.

FAST_GRAD_FN = "_AttentionProbsBackward"


class PassThrough(torch.overrides.TorchFunctionMode):
    """A torch-function mode that changes nothing but sees the calls: under it qksoftmax takes the ops."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if str(func).startswith("qksoftmax."):
            self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("save", SAVES)
def test_fast_path_matches_the_ops(device, save):
    """Same P, same gradients; bit for bit where the backward is deterministic (the CPU)."""
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    case = Case(2, 4, 2, 40, 40, head_dim(device))
    q, k, dp = tensors(11, dtype, device, case.q_shape, case.k_shape, case.p_shape)
    results = {}
    for path in ("fast", "ops"):
        with PassThrough() if path == "ops" else contextlib.nullcontext() as mode:
            fq, fk = leaves(q, k)
            p = qksoftmax.attention_probs(fq, fk, save=save)
            assert (type(p.grad_fn).__name__ == FAST_GRAD_FN) == (path == "fast")
            grads = torch.autograd.grad(p, (fq, fk), grad_outputs=dp)
            p_fwd, lse = qksoftmax.forward(q, k)
            dq, dk = qksoftmax.backward(q, k, dp, lse=lse)
        if mode is not None:
            assert mode.ops[-2:] == ["qksoftmax.forward", "qksoftmax.backward_recompute"]
        results[path] = [p, *grads, p_fwd, lse, dq, dk]
    exact = device == "cpu"
    for fast, ops in zip(results["fast"], results["ops"]):
        torch.testing.assert_close(fast, ops, rtol=0 if exact else None, atol=0 if exact else None)


def test_fast_path_leaves_modes_to_the_ops():
    """Under a dispatch mode (here fake tensors) the call goes through the ops and their fake kernels."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    case = Case(1, 2, 1, 6, 7, CPU_HEAD_DIM)
    with FakeTensorMode() as mode:
        q, k = (mode.from_tensor(t).requires_grad_(True) for t in tensors(12, torch.float32, "cpu", case.q_shape,
                                                                              case.k_shape))
        p = qksoftmax.attention_probs(q, k)
        assert p.shape == case.p_shape
        assert type(p.grad_fn).__name__ != FAST_GRAD_FN


@pytest.mark.parametrize("save", SAVES)
@pytest.mark.parametrize("why", ["no_grad", "no input requires grad", "inference_mode"])
def test_fast_path_without_a_graph(device, save, why):
    """Where autograd records nothing, attention_probs skips its autograd.Function: the same P (bit for bit on the
    CPU) as the Function's, and no graph."""
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    case = Case(2, 4, 2, 9, 13, head_dim(device))
    q, k = tensors(14, dtype, device, case.q_shape, case.k_shape)
    expected = qksoftmax.attention_probs(*leaves(q, k), save=save)
    assert type(expected.grad_fn).__name__ == FAST_GRAD_FN
    inputs = (q, k) if why == "no input requires grad" else leaves(q, k)
    context = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode}.get(why, torch.enable_grad)
    with context():
        p = qksoftmax.attention_probs(*inputs, save=save)
    assert p.grad_fn is None and not p.requires_grad
    exact = device == "cpu"
    torch.testing.assert_close(p, expected.detach(), rtol=0 if exact else None, atol=0 if exact else None)


@pytest.mark.parametrize("grad", [True, False])
def test_forward_mode_ad_is_refused(grad):
    """Dual tensors (torch.autograd.forward_ad) are refused as the autograd.Function and the op refuse them (no
    jvp is implemented), with or without grad mode: never a P without its tangent."""
    import torch.autograd.forward_ad as fwAD

    case = Case(1, 2, 1, 5, 5, CPU_HEAD_DIM)
    q, k = tensors(15, torch.float64, "cpu", case.q_shape, case.k_shape)
    with fwAD.dual_level(), torch.set_grad_enabled(grad):
        dual_q = fwAD.make_dual(q, torch.ones_like(q))
        with pytest.raises(NotImplementedError, match="jvp"):
            qksoftmax.attention_probs(dual_q, k)


@pytest.mark.parametrize("save", SAVES)
def test_double_backward_is_refused(save):
    """No second derivative is implemented: a graph of the first must refuse to be differentiated, not
    treat dq as a constant (on either path)."""
    case = Case(1, 2, 1, 5, 5, CPU_HEAD_DIM)
    q, k = leaves(*tensors(13, torch.float64, "cpu", case.q_shape, case.k_shape))
    p = qksoftmax.attention_probs(q, k, save=save)
    dq, _ = torch.autograd.grad(p.sum(), (q, k), create_graph=True)
    assert dq.requires_grad
    with pytest.raises(NotImplementedError, match="no second derivative is implemented"):
        dq.sum().backward()


# A shape for each CUDA kernel family: generic (any S), and Hopper (16-bit, D = 128, S a multiple of 8),
# whose backward also clears and reduces a dQ accumulator inside the captured graph.
GRAPH_SHAPES = {"generic": (65, CUDA_HEAD_DIM), "hopper": (72, 128)}


@requires_cuda
@pytest.mark.parametrize("save", SAVES)
@pytest.mark.parametrize("path", GRAPH_SHAPES)
def test_cuda_graph_capture_and_replay(cuda_backend, save, path):
    """Forward and backward captured whole: every allocation from the graph's pool, every kernel on the
    capturing stream. Replays on new values of the static inputs match eager runs."""
    seq, head_dim = GRAPH_SHAPES[path]
    case = Case(2, 4, 2, seq, seq, head_dim)
    q, k, weight = tensors(8, torch.bfloat16, "cuda", case.q_shape, case.k_shape, case.p_shape)
    q, k = leaves(q, k)

    def step() -> None:
        scores_loss(q, k, weight, save).backward()

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    q.grad = k.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for seed in (9, 10):
        new_q, new_k = tensors(seed, torch.bfloat16, "cuda", case.q_shape, case.k_shape)
        with torch.no_grad():
            q.copy_(new_q)
            k.copy_(new_k)
        graph.replay()
        torch.cuda.synchronize()
        _, dq, dk = loss_and_gradients(scores_loss, new_q, new_k, weight, save)
        torch.testing.assert_close(q.grad, dq)
        torch.testing.assert_close(k.grad, dk)
