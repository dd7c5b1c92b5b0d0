"""Imports qksoftmax as installed or from PYTHONPATH; failing both, from the source tree (python/) in place."""

import importlib.util
import sys
from pathlib import Path

IN_PLACE = Path(__file__).resolve().parents[2] / "python"

if importlib.util.find_spec("qksoftmax") is None:
    sys.path.insert(0, str(IN_PLACE))


def pytest_report_header(config):
    try:
        import qksoftmax
    except ImportError as error:
        return f"qksoftmax: not importable: {error}"
    return f"qksoftmax {qksoftmax.__version__} from {Path(qksoftmax.__file__).parent}"
