#!/usr/bin/env bash
# The whole test suite on a fresh Debian machine (GPU or not): installs what it needs, builds the
# library, its tests, the bench and the Python package in ONE build (pip's, kept in build/test),
# runs the C++ tests (CTest) and the Python tests against the installed package.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
JOBS=${JOBS:-$(nproc)}

scripts/deps.sh
# A wheel build with the C++ tests and the bench switched on; scikit-build-core keeps the build tree.
CMAKE_BUILD_PARALLEL_LEVEL=$JOBS "$PY" -m pip install -q . \
  -C build-dir=build/test \
  -C cmake.define.QKSOFTMAX_BUILD_TESTS=ON \
  -C cmake.define.QKSOFTMAX_BUILD_BENCH=ON \
  -C cmake.define.QKSOFTMAX_ENABLE_CUDA="${QKSOFTMAX_ENABLE_CUDA:-AUTO}"
ctest --test-dir build/test --output-on-failure --timeout 900
# From outside the source tree, so that the installed package (not python/) is imported.
(cd tests/python && "$PY" -m pytest -q -rs -p no:cacheprovider .)
