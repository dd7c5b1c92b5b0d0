"""torch autograd for qksoftmax.attention_probs (imported on first use: torch stays optional).

One torch.autograd.Function around the fused forward and the fused recompute backward. The work is done by
_api's _forward and _backward, plain functions of tensors: torch.library custom ops can wrap the same two.
"""

from __future__ import annotations

from typing import Any

import torch

from ._api import _backward, _forward

WHERE = "qksoftmax.attention_probs"


class AttentionProbs(torch.autograd.Function):
    """p = softmax(mask(scale · q kᵀ)); saves q, k and the log-sum-exp, recomputes P in backward."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, scale: float | None, causal: bool) -> torch.Tensor:
        p, lse = _forward(WHERE, q, k, scale, causal)
        ctx.save_for_backward(q, k, lse)
        ctx.scale = scale
        ctx.causal = causal
        return p

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, dp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None, None]:
        q, k, lse = ctx.saved_tensors
        dq, dk = _backward(WHERE, q, k, dp, None, lse, ctx.scale, ctx.causal)
        return dq, dk, None, None
