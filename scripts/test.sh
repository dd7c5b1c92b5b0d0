#!/usr/bin/env bash
# The whole test suite (CI runs this), on a Debian machine with or without a GPU: installs what it needs
# (scripts/deps.sh, into a virtual environment), builds everything once (scripts/build.sh), runs the C++ tests
# (CTest) and the Python tests (pytest, torch included) against the installed package. Tests that need a CUDA
# GPU are reported as skipped, with the reason, where there is none.
#   QKSOFTMAX_TORCH=0 scripts/test.sh     without installing torch (its tests are then skipped)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
JOBS=${JOBS:-$(nproc)}

stage() {  # name, command...: runs the command and says how long it took
  local name=$1 start=$SECONDS
  shift
  echo "=== test.sh: $name"
  "$@"
  echo "=== test.sh: $name took $((SECONDS - start)) s"
}

if [ "${QKSOFTMAX_TORCH:-1}" = 0 ]; then stage deps scripts/deps.sh; else stage deps scripts/deps.sh --torch; fi
stage build scripts/build.sh
stage ctest ctest --test-dir build --output-on-failure --timeout 900 -j "$JOBS"
# From outside the source tree, so that the installed package (not python/) is imported.
stage pytest bash -c "cd tests/python && '$PY' -m pytest -q -rs -p no:cacheprovider ."
