"""Imports qksoftmax as installed or from PYTHONPATH; failing both, from the source tree (python/) in place."""

import importlib.util
import os
import sys
from pathlib import Path

import pytest

IN_PLACE = Path(__file__).resolve().parents[2] / "python"

if importlib.util.find_spec("qksoftmax") is None:
    sys.path.insert(0, str(IN_PLACE))


def pytest_report_header(config):
    try:
        import qksoftmax
    except ImportError as error:
        return f"qksoftmax: not importable: {error}"
    return f"qksoftmax {qksoftmax.__version__} from {Path(qksoftmax.__file__).parent}"


@pytest.fixture(scope="session")
def cuda_backend() -> None:
    """Skips a test without torch and a CUDA device; with QKSOFTMAX_REQUIRE_GPU=1 (the GPU machine's
    scripts/gpu-check.sh) a missing GPU fails instead, so that a broken setup cannot pass as skipped."""
    if os.environ.get("QKSOFTMAX_REQUIRE_GPU") == "1":
        import torch

        assert torch.cuda.is_available(), "QKSOFTMAX_REQUIRE_GPU=1 but torch sees no CUDA device"
        return
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs torch with a CUDA device")


@pytest.fixture(params=["cpu", "cuda"])
def device(request) -> str:
    """Each torch device: the CPU always, CUDA where cuda_backend does not skip."""
    if request.param == "cuda":
        request.getfixturevalue("cuda_backend")
    return request.param
