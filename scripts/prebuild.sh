#!/usr/bin/env bash
# Builds sp-ab-check.sh's variant trees on this machine (no GPU needed: nvcc 13.0, sm_90a, as on the device) and packs
# them for a device call, so that the call spends its minutes running rather than compiling. AB and UNTESTED as
# sp-ab-check.sh takes them; per variant build/prebuilt/NAME.tar.xz (the shared library, the bench, the step
# benchmark and, unless UNTESTED, the kernel tests; machine code alone, no PTX; run-paths relative to the
# binaries) and NAME.flags (the CUDA flags, the revision and the hash of the sources it was built from,
# scripts/source_hash.sh, which sp-ab-check.sh compares before using it), and deps.tar.xz (.deps, for the device's fallback build where a packed tree does not run there). Carry
# build/prebuilt alone.
#
#   AB="main=;rs=-DQKSOFTMAX_SM90_SP_DQ_RS" UNTESTED=main scripts/prebuild.sh   (~11 min a tree with its kernel tests on 2 cores)
#   AB="main=" SUITE=main scripts/prebuild.sh   (main's pack with the library's tests too, for sp-ab-check.sh's GPU_SUITE)
# shellcheck disable=SC2086,SC2016
set -euo pipefail
cd "$(dirname "$0")/.."
AB=${AB:?AB="name=flags;..." as sp-ab-check.sh takes it}
UNTESTED=${UNTESTED:-}
SUITE=${SUITE:-}  # variants whose packs also hold the library's tests (qksoftmax_tests: the GPU suite's C++ part)
JOBS=${JOBS:-$(nproc)}
PRE=build/prebuilt
mkdir -p "$PRE"
[ -e .deps/cutlass/include/cute/tensor.hpp ] || scripts/deps.sh
tar -cJf "$PRE/deps.tar.xz" .deps
IFS=';' read -r -a variants <<< "$AB"
for v in "${variants[@]}"; do
  name=${v%%=*} flags=${v#*=} src=.
  if [[ $name == *@* ]]; then src=${name#*@} name=${name%%@*}; fi
  [ -e "$src/.deps" ] || ln -s "$PWD/.deps" "$src/.deps"
  tree=build/pre-$name
  cmake -S "$src" -B "$tree" -G Ninja -DCMAKE_BUILD_TYPE=Release -DQKSOFTMAX_BUILD_TESTS=ON \
    -DQKSOFTMAX_BUILD_BENCH=ON -DQKSOFTMAX_BUILD_PYTHON=OFF "-DCMAKE_CUDA_FLAGS=$flags" -DCMAKE_CUDA_ARCHITECTURES=90a-real \
    '-DCMAKE_BUILD_RPATH=$ORIGIN/..;$ORIGIN/../..;/usr/local/cuda/lib64' > "$tree.log"
  targets="qksoftmax-step qksoftmax-bench"
  files="libqksoftmax.so* bench/qksoftmax-step bench/qksoftmax-bench"
  if [[ " $UNTESTED " != *" $name "* ]]; then
    targets+=" qksoftmax_kernel_tests"
    files+=" tests/cpp/qksoftmax_kernel_tests"
  fi
  if [[ " $SUITE " == *" $name "* ]]; then
    targets+=" qksoftmax_tests"
    files+=" tests/cpp/qksoftmax_tests"
  fi
  echo "== $name: building $targets ($flags)"
  cmake --build "$tree" -j "$JOBS" --target $targets >> "$tree.log"
  grep -hE "C7510|C7512|C7518" "$tree.log" | head -3 || true
  (cd "$tree" && tar -cJf - $files) > "$PRE/$name.tar.xz"
  rev=$(git -C "$src" rev-parse HEAD 2> /dev/null || echo "$src")
  printf '%s\n%s\n%s\n' "$flags" "$rev$(git -C "$src" diff --quiet HEAD 2> /dev/null || echo '+changes')" \
    "$(scripts/source_hash.sh "$src")" > "$PRE/$name.flags"
  ls -la "$PRE/$name.tar.xz"
done
du -sh "$PRE"
