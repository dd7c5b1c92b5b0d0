"""A training step of a randomly initialised Llama-style model (bf16, head_dim 128, GQA, no weights fetched) with
output_attentions=True, under attn_implementation="qksoftmax" against transformers' "eager" (and "sdpa", which
returns no attention weights, for reference): forward, loss, backward, an SGD step.

    PYTHONPATH=python python3 bench/transformers_step.py [--json FILE] [--steps 20] [--warmup 3]

Two configurations: a small model where host time matters (B = 2, S = 512, 16 heads with 4 key heads, 2 layers)
and a larger one (B = 8, S = 2048, 32 heads with 8 key heads, 4 layers). Each step is timed with CUDA events;
the figure is the median over --steps steps after --warmup, with the peak memory of the steps.
"""

from __future__ import annotations

import argparse
import copy
import statistics

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

from qksoftmax.integrations import transformers as qk_transformers
from results_file import write_results

HEAD_DIM = 128
VOCAB = 4096
MLP_RATIO = 2
LEARNING_RATE = 1e-4
CONFIGS = {
    "small": dict(batch=2, seq=512, heads=16, kv_heads=4, layers=2),
    "large": dict(batch=8, seq=2048, heads=32, kv_heads=8, layers=4),
}
IMPLEMENTATIONS = ["eager", qk_transformers.NAME, "sdpa"]


def make_model(shape: dict, implementation: str) -> LlamaForCausalLM:
    width = shape["heads"] * HEAD_DIM
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=width, intermediate_size=MLP_RATIO * width,
                         num_hidden_layers=shape["layers"], num_attention_heads=shape["heads"],
                         num_key_value_heads=shape["kv_heads"], head_dim=HEAD_DIM,
                         max_position_embeddings=shape["seq"])
    torch.manual_seed(0)
    model = LlamaForCausalLM._from_config(copy.deepcopy(config), attn_implementation=implementation,
                                          dtype=torch.bfloat16)
    return model.cuda().train()


def time_steps(shape: dict, implementation: str, steps: int, warmup: int) -> dict:
    model = make_model(shape, implementation)
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    generator = torch.Generator(device="cuda").manual_seed(1)
    ids = torch.randint(0, VOCAB, (shape["batch"], shape["seq"]), device="cuda", generator=generator)
    attentions = implementation != "sdpa"  # sdpa returns no weights (and warns when asked)

    def step() -> float:
        out = model(input_ids=ids, labels=ids, output_attentions=attentions)
        if attentions:
            assert len(out.attentions) == shape["layers"] and out.attentions[0] is not None
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return out.loss.detach()

    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        loss = step()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    result = {"impl": implementation, "output_attentions": attentions, "step_ms": statistics.median(times),
              "step_ms_all": times, "peak_memory_GiB": torch.cuda.max_memory_allocated() / 2**30,
              "last_loss": float(loss)}
    del model, optimizer
    torch.cuda.empty_cache()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", default=",".join(CONFIGS), help="which of " + ", ".join(CONFIGS))
    parser.add_argument("--impls", default=",".join(IMPLEMENTATIONS), help="attention implementations to time")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--json", help="write the figures to this results file")
    args = parser.parse_args()
    qk_transformers.register()
    runs = []
    for name in args.configs.split(","):
        shape = CONFIGS[name]
        by_impl = {}
        for implementation in args.impls.split(","):
            run = {"config": name, **shape, "head_dim": HEAD_DIM,
                   **time_steps(shape, implementation, args.steps, args.warmup)}
            by_impl[implementation] = run
            runs.append(run)
            print(f"{name:6} {shape}  {implementation:10} step {run['step_ms']:9.2f} ms  "
                  f"peak {run['peak_memory_GiB']:6.1f} GiB  loss {run['last_loss']:.4f}", flush=True)
        if "eager" in by_impl and qk_transformers.NAME in by_impl:
            speedup = by_impl["eager"]["step_ms"] / by_impl[qk_transformers.NAME]["step_ms"]
            by_impl[qk_transformers.NAME]["speedup_vs_eager"] = speedup
            print(f"{name:6} qksoftmax vs eager, output_attentions=True: {speedup:.2f}x", flush=True)
    if args.json:
        write_results(args.json, torch.cuda.get_device_name(), runs, transformers=transformers.__version__,
                      step="forward (output_attentions=True but for sdpa), causal LM loss, backward, SGD step; bf16")


if __name__ == "__main__":
    main()
