"""What the Python benches share: their figures written as a results file in bench/results' format (gpu, date,
command, versions, the bench's own fields, runs)."""

from __future__ import annotations

import datetime
import json
import shlex
import sys
from typing import Any

import torch

import qksoftmax


def write_results(path: str, gpu: str, runs: list[dict[str, Any]], **fields: Any) -> None:
    result = {
        "gpu": gpu,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": "PYTHONPATH=python python3 " + shlex.join(sys.argv),
        "torch": torch.__version__,
        "qksoftmax_version": qksoftmax.__version__,
        **fields,
        "runs": runs,
    }
    with open(path, "w") as file:
        json.dump(result, file, indent=1)
        file.write("\n")
