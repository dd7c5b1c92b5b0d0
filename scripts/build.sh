#!/usr/bin/env bash
# Builds everything once, in one tree (build/): the library, its C++ tests, the bench and the Python package,
# which is installed into the virtual environment of scripts/venv.sh. scripts/test.sh and scripts/bench.sh
# build through this; `pip install .` uses the same tree (pyproject.toml). Run scripts/deps.sh first.
# CUDA: QKSOFTMAX_ENABLE_CUDA=AUTO (default: where nvcc is found), ON or OFF. JOBS: parallel compilations.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
JOBS=${JOBS:-$(nproc)}

start=$SECONDS
# -v shows CMake's configuration and ninja's [n/total] progress; the kernels take minutes.
CMAKE_BUILD_PARALLEL_LEVEL=$JOBS "$PY" -m pip install -v --no-build-isolation . \
  -C cmake.define.QKSOFTMAX_BUILD_TESTS=ON \
  -C cmake.define.QKSOFTMAX_BUILD_BENCH=ON \
  -C cmake.define.QKSOFTMAX_ENABLE_CUDA="${QKSOFTMAX_ENABLE_CUDA:-AUTO}"
echo "build.sh: built in $((SECONDS - start)) s (build/, package installed into $VENV)"
