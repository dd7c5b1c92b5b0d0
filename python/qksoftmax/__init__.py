"""qksoftmax: P = softmax(mask(scale · Q Kᵀ)) and its fused backward, on torch tensors and numpy arrays.

    p, lse = qksoftmax.forward(q, k, *, scale=None, causal=True)
    dq, dk = qksoftmax.backward(q, k, dp, *, p=None, lse=None, scale=None, causal=True)
    p      = qksoftmax.attention_probs(q, k, *, scale=None, causal=True, save="lse")   # torch autograd

q: (B, Hq, Sq, D), k: (B, Hk, Sk, D), p and dp: (B, Hq, Sq, Sk), lse: (B, Hq, Sq) float32. CUDA tensors run
on their GPU (on torch's current stream of that device, whatever device is current), CPU tensors and numpy
arrays on the fp64 CPU backend. Where torch is
installed, importing qksoftmax imports it and registers the custom ops torch.ops.qksoftmax.forward,
backward_recompute and backward_saved_p (docs/PYTORCH.md).
"""

try:
    from . import _C
except ImportError as error:
    raise ImportError(
        "qksoftmax: the extension qksoftmax._C is not built: `pip install .` from the repository, or "
        "`cmake -S . -B build/py -DQKSOFTMAX_BUILD_PYTHON=ON && cmake --build build/py` and PYTHONPATH=python"
    ) from error

from ._api import attention_probs, backward, forward

__version__: str = _C.version()
__all__ = ["attention_probs", "backward", "forward", "__version__"]
