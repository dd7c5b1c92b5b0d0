"""examples/train_tiny_block.py runs: tiny configurations, compiled with fullgraph=True (no graph break)."""

import importlib
from pathlib import Path

import pytest

from qk_reference import CUDA_HEAD_DIM

pytest.importorskip("torch")

from torch_util import requires_cuda  # noqa: E402  (after the skip: torch_util imports torch)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture
def example(monkeypatch):
    """The example, imported as a module (its dataclass needs to be in sys.modules)."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    return importlib.import_module("train_tiny_block")


TINY = ["--batch", "2", "--seq", "16", "--steps", "4"]


def test_trains_a_tiny_block_on_the_cpu(example, capsys):
    # aot_eager: dynamo still fails on any graph break, without inductor compiling C++ for the CPU.
    config = example.parse_config(TINY + ["--device", "cpu", "--width", "32", "--compile-backend", "aot_eager"])
    losses = example.main(config)["losses"]
    assert len(losses) == config.steps and losses[-1] < losses[0]
    assert "timing the attention-score block needs a CUDA GPU" in capsys.readouterr().out


@requires_cuda
def test_trains_and_times_on_cuda(example, cuda_backend):
    timing = ["--time-batch", "1", "--time-heads", "2", "--time-seq", "256", "--time-head-dim", str(CUDA_HEAD_DIM),
              "--warmups", "1", "--repeats", "2"]
    width = example.Config.heads * CUDA_HEAD_DIM  # a head dimension the CUDA kernels cover
    config = example.parse_config(TINY + timing + ["--device", "cuda", "--width", str(width)])
    times = example.main(config)["times_ms"]
    assert sorted(times) == ["qksoftmax compiled", "qksoftmax eager", "torch compiled", "torch eager"]
    assert all(ms > 0 for ms in times.values())
