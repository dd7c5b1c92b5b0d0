"""Every call runs on the device of its tensors, whatever device is current and from whichever thread, on that
device's current stream; tensors on two devices are refused naming the argument. Forward, backward (both
modes) and attention_probs forward + backward against the fp64 reference. The two-GPU cases skip unless two
CUDA devices are present."""

from __future__ import annotations

import threading

import pytest

import qk_reference as ref
import qksoftmax
from qk_reference import Case, rel_error

torch = pytest.importorskip("torch")

from torch_util import HAS_CUDA, requires_cuda, tensors, to_numpy, tolerance  # noqa: E402  (after the skip)

requires_two_gpus = pytest.mark.skipif(not HAS_CUDA or torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")

# GQA, Sq != Sk; D = 128 takes the Hopper kernels (TMA descriptors, per-device kernel attributes) and D = 64 the
# generic ones.
CASES = [Case(2, 4, 2, 33, 40, 128), Case(1, 2, 1, 65, 65, 64)]
DTYPE = torch.bfloat16


def run_everything(case: Case, device: str) -> dict[str, torch.Tensor]:
    """Forward, both backward modes and attention_probs forward + backward, with every tensor on `device`
    (the results synchronised, on the CPU)."""
    q, k, dp = tensors(30, DTYPE, device, case.q_shape, case.k_shape, case.p_shape)
    p, lse = qksoftmax.forward(q, k)
    dq_lse, dk_lse = qksoftmax.backward(q, k, dp, lse=lse)
    dq_p, dk_p = qksoftmax.backward(q, k, dp, p=p)
    qg, kg = q.clone().requires_grad_(True), k.clone().requires_grad_(True)
    probs = qksoftmax.attention_probs(qg, kg)
    dq_ap, dk_ap = torch.autograd.grad(probs, (qg, kg), dp)
    out = {"q": q, "k": k, "dp": dp, "p": p, "dq lse": dq_lse, "dk lse": dk_lse, "dq p": dq_p, "dk p": dk_p,
           "probs": probs, "dq attention_probs": dq_ap, "dk attention_probs": dk_ap}
    for name, x in out.items():
        assert x.device == torch.device(device), f"{name} is on {x.device}, its inputs on {device}"
    return {name: x.detach().cpu() for name, x in out.items()}


def expect_matches_reference(got: dict[str, torch.Tensor]) -> None:
    q, k, dp = (to_numpy(got[name]) for name in ("q", "k", "dp"))
    p_ref, _ = ref.forward(q, k)
    dq_ref, dk_ref = ref.backward(q, k, dp)
    bound = tolerance(DTYPE)
    expected = {"p": p_ref, "probs": p_ref}
    for variant in ("lse", "p", "attention_probs"):
        expected.update({f"dq {variant}": dq_ref, f"dk {variant}": dk_ref})
    errors = {name: rel_error(to_numpy(got[name]), value) for name, value in expected.items()}
    assert all(error <= bound for error in errors.values()), errors


@requires_two_gpus
@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize(("current", "tensors_on"), [(0, 1), (1, 0)])
def test_runs_on_the_tensors_device_whichever_is_current(cuda_backend, case, current, tensors_on):
    with torch.cuda.device(current):
        got = run_everything(case, f"cuda:{tensors_on}")
        assert torch.cuda.current_device() == current
    expect_matches_reference(got)


@requires_two_gpus
def test_tensors_on_two_devices_are_refused(cuda_backend):
    case = CASES[0]
    q, k, dp = tensors(31, DTYPE, "cuda:0", case.q_shape, case.k_shape, case.p_shape)
    k1, dp1 = k.to("cuda:1"), dp.to("cuda:1")
    with pytest.raises(ValueError, match="qksoftmax.forward: k must be on cuda:0 like q, got cuda:1"):
        qksoftmax.forward(q, k1)
    with pytest.raises(ValueError, match="qksoftmax.backward: dp must be on cuda:0 like q, got cuda:1"):
        qksoftmax.backward(q, k, dp1)
    with pytest.raises(ValueError, match="qksoftmax.attention_probs: k must be on cuda:0 like q, got cuda:1"):
        qksoftmax.attention_probs(q.requires_grad_(True), k1)
    # The ops (a compiled graph's path) say it in the C++ API's words.
    with pytest.raises(ValueError, match=r"^k: expected device cuda:0 like q, got cuda:1 \(the tensors of a call"):
        torch.ops.qksoftmax.forward(q.detach(), k1, None, True, "lse")


@requires_cuda
@pytest.mark.parametrize("case", CASES, ids=str)
def test_runs_from_threads_that_never_used_cuda(cuda_backend, case):
    """Each thread starts with no current device of its own (autograd's device threads are such threads)."""
    got: list[dict[str, torch.Tensor]] = []
    devices = [f"cuda:{index}" for index in range(torch.cuda.device_count())]
    workers = [threading.Thread(target=lambda d=d: got.append(run_everything(case, d))) for d in devices]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert len(got) == len(devices)
    for result in got:
        expect_matches_reference(result)


@requires_cuda
def test_runs_on_the_current_stream(cuda_backend):
    """Inputs written on a side stream and read there at once, without synchronising: the calls must run on
    that stream (the device's current one), after the writes."""
    case = CASES[0]
    side = torch.cuda.Stream()
    base_q, base_k = tensors(32, DTYPE, "cuda", case.q_shape, case.k_shape)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(1_000_000)  # about a millisecond: the writes below land late on this stream
        q, k = base_q * 2, base_k * 2
        p, lse = qksoftmax.forward(q, k)
        dp = p * 3 - 1  # varies along a row: a constant dP has dQ = dK = 0, which a relative error cannot judge
        dq, dk = qksoftmax.backward(q, k, dp, lse=lse)
    side.synchronize()
    p_ref, _ = ref.forward(to_numpy(q), to_numpy(k))
    dq_ref, dk_ref = ref.backward(to_numpy(q), to_numpy(k), to_numpy(dp))
    assert rel_error(to_numpy(p), p_ref) <= tolerance(DTYPE)
    assert rel_error(to_numpy(dq), dq_ref) <= tolerance(DTYPE)
    assert rel_error(to_numpy(dk), dk_ref) <= tolerance(DTYPE)


@requires_cuda
def test_current_device_and_its_stream_are_left_alone(cuda_backend):
    case = CASES[1]
    current = torch.cuda.current_device()
    stream = torch.cuda.current_stream()
    run_everything(case, f"cuda:{torch.cuda.device_count() - 1}")
    assert torch.cuda.current_device() == current
    assert torch.cuda.current_stream() == stream
