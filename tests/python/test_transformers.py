"""qksoftmax.integrations.transformers: a randomly initialised Llama-style model (GQA, no weights fetched) with
attn_implementation="qksoftmax" against the same model with transformers' eager attention: loss, attention
weights (output_attentions=True) and every gradient; padding refused; generation with a KV cache. On the CPU
(float32, the CPU backend) and on CUDA (bf16, head_dim 128). Skipped without transformers."""

from __future__ import annotations

import copy

import pytest

from qk_reference import rel_error

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from torch_util import requires_cuda, to_numpy  # noqa: E402  (after the skips)
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from qksoftmax.integrations import transformers as qk_transformers  # noqa: E402

VOCAB = 256
CPU_CONFIG = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16)
CUDA_CONFIG = dict(hidden_size=512, intermediate_size=1024, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=128)
CPU_TOLERANCE = 1e-5  # float32: the CPU backend is fp64 inside, eager's softmax float32
BF16_TOLERANCE = 1e-2


@pytest.fixture(scope="module", autouse=True)
def registered() -> str:
    return qk_transformers.register()


def models(config: dict, dtype: torch.dtype, device: str, implementations: list[str]) -> list[LlamaForCausalLM]:
    """The same random weights under each attention implementation."""
    base = LlamaConfig(vocab_size=VOCAB, max_position_embeddings=4096, **config)
    torch.manual_seed(0)
    made = []
    for implementation in implementations:
        model = LlamaForCausalLM._from_config(copy.deepcopy(base), attn_implementation=implementation, dtype=dtype)
        if made:
            model.load_state_dict(made[0].state_dict())
        made.append(model.to(device).train())
    return made


def training_pass(model: LlamaForCausalLM, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """Loss, the attention weights of every layer and every gradient (float32 copies)."""
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, labels=ids, output_attentions=True)
    out.loss.backward()
    got = {"loss": out.loss.detach().float().reshape(1)}
    got.update({f"attention {i}": a.detach().float() for i, a in enumerate(out.attentions)})
    got.update({f"grad {name}": p.grad.float() for name, p in model.named_parameters()})
    return got


def test_registers_an_attention_implementation(registered):
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    assert registered == "qksoftmax"
    assert AttentionInterface._global_mapping["qksoftmax"] is qk_transformers.attention_forward
    assert "qksoftmax" in AttentionMaskInterface._global_mapping


def test_matches_eager_on_the_cpu():
    eager, ours = models(CPU_CONFIG, torch.float32, "cpu", ["eager", "qksoftmax"])
    assert ours.config._attn_implementation == "qksoftmax"
    ids = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(1))
    expected, got = training_pass(eager, ids), training_pass(ours, ids)
    assert got.keys() == expected.keys()
    errors = {name: rel_error(to_numpy(got[name]), to_numpy(expected[name])) for name in expected}
    assert max(errors.values()) <= CPU_TOLERANCE, errors


def test_generates_like_eager_with_a_cache():
    """Prefill (causal, no mask) then one query at a time (no mask: it sees every key)."""
    eager, ours = (model.eval() for model in models(CPU_CONFIG, torch.float32, "cpu", ["eager", "qksoftmax"]))
    prompt = torch.randint(0, VOCAB, (1, 10), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.equal(ours.generate(prompt, max_new_tokens=6, do_sample=False),
                           eager.generate(prompt, max_new_tokens=6, do_sample=False))


def test_refuses_padding():
    (model,) = models(CPU_CONFIG, torch.float32, "cpu", ["qksoftmax"])
    ids = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(3))
    padding = torch.ones_like(ids)
    padding[1, :3] = 0
    with pytest.raises(ValueError, match="attn_implementation='qksoftmax' takes causal attention without a mask"):
        model(input_ids=ids, attention_mask=padding)
    model(input_ids=ids, attention_mask=torch.ones_like(ids))  # a mask without padding is dropped


@requires_cuda
def test_matches_eager_on_cuda_in_bf16(cuda_backend):
    """bf16, head_dim 128 (the Hopper kernels), GQA. The reference is eager attention in float32: qksoftmax's
    model must be within bf16's tolerance of it, or no further than twice eager's own bf16 model."""
    reference, eager, ours = models(CUDA_CONFIG, torch.float32, "cuda", ["eager", "eager", "qksoftmax"])
    eager.to(torch.bfloat16)
    ours.to(torch.bfloat16)
    ids = torch.randint(0, VOCAB, (2, 256), generator=torch.Generator().manual_seed(4)).cuda()
    truth, eager_bf16, got = training_pass(reference, ids), training_pass(eager, ids), training_pass(ours, ids)
    too_far = {}
    for name, value in truth.items():
        ours_error = rel_error(to_numpy(got[name]), to_numpy(value))
        eager_error = rel_error(to_numpy(eager_bf16[name]), to_numpy(value))
        if not ours_error <= max(BF16_TOLERANCE, 2 * eager_error):
            too_far[name] = (ours_error, eager_error)
    assert not too_far, too_far
