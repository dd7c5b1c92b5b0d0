"""Imports qksoftmax as installed or from PYTHONPATH; failing both, from the source tree (python/) in place."""

import importlib.util
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
    """Skips a test without torch and a CUDA device, or while the CUDA backend runs nothing (before its kernels)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs torch with a CUDA device")
    import qksoftmax
    from qk_reference import CUDA_HEAD_DIM

    q = torch.zeros(1, 1, 1, CUDA_HEAD_DIM, dtype=torch.bfloat16, device="cuda")
    try:
        qksoftmax.forward(q, q)
    except NotImplementedError as error:
        pytest.skip(f"the CUDA backend runs nothing yet: {error}")


@pytest.fixture(params=["cpu", "cuda"])
def device(request) -> str:
    """Each torch device: the CPU always, CUDA where cuda_backend does not skip."""
    if request.param == "cuda":
        request.getfixturevalue("cuda_backend")
    return request.param
