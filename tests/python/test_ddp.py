"""examples/ddp_step.py: one data-parallel training step over two GPUs (NCCL, DistributedDataParallel, one process
per GPU) agrees with the same step on one GPU with the whole batch. Skipped unless two CUDA devices are present."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 300


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")
def test_data_parallel_step_matches_one_gpu(tmp_path):
    import qksoftmax

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(qksoftmax.__file__).parents[1]),
                                                       os.environ.get("PYTHONPATH", "")]))
    figures = tmp_path / "ddp.json"
    command = [sys.executable, str(ROOT / "examples" / "ddp_step.py"), "--gpus", "2", "--batch", "4", "--seq", "128",
               "--json", str(figures)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ok" in done.stdout.splitlines()[-1]
    assert figures.exists()
