"""The torch path from several host threads at once: attention_probs forward + backward (the backward in
autograd's device thread) on the eager fast path and through the custom ops, in both save modes, on the default
stream and on a stream per thread. Every result must equal, within bf16's tolerance, the same call made alone
(P bitwise: the forward is deterministic). A process that once crashed in autograd's thread while encoding a TMA
descriptor is what this looks for: hundreds of calls of the Hopper kernels (D = 128) and the generic ones
(D = 64), racing."""

from __future__ import annotations

import contextlib
import itertools
import threading

import pytest

from qk_reference import Case, rel_error

torch = pytest.importorskip("torch")

import qksoftmax  # noqa: E402
from torch_util import requires_cuda, tensors, to_numpy, tolerance  # noqa: E402  (after the skip)

THREADS = 4
ROUNDS = 25
CASES = [Case(2, 4, 2, 256, 256, 128), Case(1, 4, 4, 200, 200, 64)]
DTYPE = torch.bfloat16
WAYS = list(itertools.product(["eager", "ops"], ["lse", "p"]))  # (path, save)


def step(q: torch.Tensor, k: torch.Tensor, dp: torch.Tensor, path: str, save: str) -> tuple[torch.Tensor, ...]:
    qg, kg = q.detach().requires_grad_(True), k.detach().requires_grad_(True)
    if path == "eager":
        p = qksoftmax.attention_probs(qg, kg, save=save)
    else:
        p, _ = torch.ops.qksoftmax.forward(qg, kg, None, True, save)
    dq, dk = torch.autograd.grad(p, (qg, kg), dp)
    return p.detach(), dq, dk


@requires_cuda
@pytest.mark.parametrize("case", CASES, ids=str)
def test_many_threads_at_once(cuda_backend, case):
    inputs = tensors(40, DTYPE, "cuda", case.q_shape, case.k_shape, case.p_shape)
    expected = {way: [x.cpu() for x in step(*inputs, *way)] for way in WAYS}
    torch.cuda.synchronize()
    failures: list[str] = []

    def work(index: int) -> None:
        own_stream = index % 2 == 1
        with torch.cuda.stream(torch.cuda.Stream()) if own_stream else contextlib.nullcontext():
            for round_ in range(ROUNDS):
                way = WAYS[(index + round_) % len(WAYS)]
                got = [x.cpu() for x in step(*inputs, *way)]
                where = f"thread {index} ({'own stream' if own_stream else 'default stream'}), round {round_}, {way}"
                if not torch.equal(got[0], expected[way][0]):
                    failures.append(f"{where}: p differs")
                for name, value, reference in zip(("dq", "dk"), got[1:], expected[way][1:]):
                    error = rel_error(to_numpy(value), to_numpy(reference))
                    if not error <= tolerance(DTYPE):
                        failures.append(f"{where}: {name} relative error {error}")

    def guarded(index: int) -> None:
        try:
            work(index)
        except Exception as error:  # noqa: BLE001  (reported below, with the thread that raised it)
            failures.append(f"thread {index}: {type(error).__name__}: {error}")

    workers = [threading.Thread(target=guarded, args=(index,)) for index in range(THREADS)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert not failures, "\n".join(failures[:20])
