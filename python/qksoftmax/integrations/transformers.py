"""qksoftmax as an attention implementation of Hugging Face transformers (5.x).

    from qksoftmax.integrations import transformers as qk_transformers
    qk_transformers.register()                     # attn_implementation="qksoftmax"
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="qksoftmax")

The attention probabilities P = softmax(scale · Q Kᵀ) (causal) come from qksoftmax.attention_probs, fused
forward and backward, and are what the layer returns as its attention weights: output_attentions=True works
and costs nothing extra. The output is P V. A GQA model's K and V keep their own key heads: neither is
repeated (each key head's group of query heads multiplies its V at once).

Causal self-attention without padding only. Where transformers cannot drop the mask (padding in
attention_mask, packed sequences, a KV cache that queries past its start, a sliding window shorter than the
sequence) the layer receives one, and the call raises ValueError; so do logit soft-capping and attention
sinks. As transformers' sdpa does, a single query (decoding with a cache) attends to every key, and a static
cache's unused slots (keys past the queries, prefill) are cut off.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

import qksoftmax

NAME = "qksoftmax"
# Keyword arguments of some models' attention that change the scores in ways qksoftmax does not implement.
UNSUPPORTED = ("softcap", "s_aux", "sinks", "position_bias")


def attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """An AttentionInterface function: query (B, Hq, Sq, D), key and value (B, Hk, Sk, D) → the output
    (B, Sq, Hq, Dv) and the attention weights (B, Hq, Sq, Sk)."""
    if attention_mask is not None:
        raise ValueError(
            f"attn_implementation={NAME!r} takes causal attention without a mask, but this call needs one "
            "(padding in attention_mask, packed sequences, a KV cache past its start or a sliding window): "
            "call the model without padding, or use another attn_implementation"
        )
    unsupported = [name for name in UNSUPPORTED if kwargs.get(name) is not None]
    if unsupported:
        raise ValueError(f"attn_implementation={NAME!r} does not implement {', '.join(unsupported)}")
    q_len, k_len = query.shape[2], key.shape[2]
    causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True)) and q_len > 1
    if causal and k_len > q_len:  # a static cache's slots past the prompt: masked for every query anyway
        key, value = key[:, :, :q_len], value[:, :, :q_len]
    probs = qksoftmax.attention_probs(query, key, scale=scaling, causal=causal)
    weights = torch.nn.functional.dropout(probs, p=dropout, training=module.training)
    batch, heads, q_len, k_len = weights.shape
    k_heads = key.shape[1]
    grouped = weights.reshape(batch, k_heads, heads // k_heads * q_len, k_len)
    output = (grouped @ value).reshape(batch, heads, q_len, value.shape[-1])
    return output.transpose(1, 2).contiguous(), weights


def register(name: str = NAME) -> str:
    """Makes `name` an attn_implementation of transformers: the attention function, and sdpa's mask function
    (no mask where a causal model needs none, a boolean mask, refused, where it does). Returns the name."""
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, sdpa_mask)
    return name
