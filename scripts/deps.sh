#!/usr/bin/env bash
# Installs what qksoftmax needs to build and test, from the registries only (Debian packages, PyPI).
# Idempotent. Header-only CUTLASS/CuTe lands in .deps/cutlass/include (ignored by git; carried to the GPU
# machine, which has no network); GoogleTest's sources are copied to .deps/googletest for the same reason.
set -euo pipefail
cd "$(dirname "$0")/.."

CUTLASS_VERSION=4.2.0.0
PY=${PYTHON:-python3}

# The CUDA backend is built where a CUDA compiler is found (nvcc on PATH, or CUDACXX), unless
# QKSOFTMAX_ENABLE_CUDA=OFF; only then are the CUTLASS/CuTe headers needed. Without it: the CPU backend alone.
ENABLE_CUDA=${QKSOFTMAX_ENABLE_CUDA:-AUTO}
with_cuda=0
if [ "$ENABLE_CUDA" != OFF ] && { [ -n "${CUDACXX:-}" ] || command -v nvcc >/dev/null; }; then with_cuda=1; fi
if [ "$ENABLE_CUDA" = ON ] && [ $with_cuda = 0 ]; then
  echo "deps.sh: QKSOFTMAX_ENABLE_CUDA=ON needs the CUDA toolkit (nvcc, CUDA 12.4 or newer for sm_90a)" >&2; exit 1
fi
"$PY" -c 'import sysconfig, os, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' ||
  { echo "deps.sh: $PY has no development headers (Python.h): install python3-dev" >&2; exit 1; }

need_apt=()
command -v cmake >/dev/null || need_apt+=(cmake)
command -v ninja >/dev/null || need_apt+=(ninja-build)
[ -d /usr/src/googletest ] || need_apt+=(googletest libgtest-dev)
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}"
  else
    echo "deps.sh: please install: ${need_apt[*]}" >&2; exit 1
  fi
fi

if [ $with_cuda = 1 ] && { [ ! -f .deps/cutlass/include/cute/tensor.hpp ] || [ "$(cat .deps/cutlass/VERSION 2>/dev/null)" != "$CUTLASS_VERSION" ]; }; then
  rm -rf .deps/cutlass .deps/_cutlass_wheel
  "$PY" -m pip download -q --no-deps --only-binary=:all: -d .deps/_cutlass_wheel "nvidia-cutlass==$CUTLASS_VERSION"
  "$PY" - <<PYEOF
import glob, zipfile, os
whl = glob.glob(".deps/_cutlass_wheel/*.whl")[0]
prefix = "cutlass_library/source/include/"
with zipfile.ZipFile(whl) as z:
    for name in z.namelist():
        if name.startswith(prefix) and not name.endswith("/"):
            dst = os.path.join(".deps/cutlass/include", name[len(prefix):])
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            with z.open(name) as src, open(dst, "wb") as out:
                out.write(src.read())
PYEOF
  echo "$CUTLASS_VERSION" > .deps/cutlass/VERSION
  rm -rf .deps/_cutlass_wheel
fi

if [ ! -f .deps/googletest/CMakeLists.txt ]; then
  mkdir -p .deps && cp -r /usr/src/googletest .deps/googletest
fi

# Python build and test tools, pinned; a package that is already importable is left as it is, so that a
# machine without network (the GPU machine, which has its own versions) needs nothing from PyPI.
missing=()
for pair in nanobind:nanobind==3.1.0 scikit_build_core:scikit-build-core==1.1.0 pytest:pytest==9.2.0 \
            numpy:numpy==2.4.6 matplotlib:matplotlib==3.11.2; do
  "$PY" -c "import ${pair%%:*}" 2>/dev/null || missing+=("${pair#*:}")
done
if [ ${#missing[@]} -gt 0 ]; then
  "$PY" -m pip install -q "${missing[@]}"
fi
