#!/usr/bin/env bash
# Builds qksoftmax-bench and runs it (on the GPU if there is one, else a small CPU case).
#   scripts/bench.sh --suite seed16 --mode all      # any qksoftmax-bench options
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh >/dev/null
cmake -S . -B build/bench -G Ninja -DCMAKE_BUILD_TYPE=Release -DQKSOFTMAX_BUILD_BENCH=ON \
  -DQKSOFTMAX_ENABLE_CUDA="${QKSOFTMAX_ENABLE_CUDA:-AUTO}" >/dev/null
cmake --build build/bench -j "$(nproc)" --target qksoftmax-bench
exec build/bench/bench/qksoftmax-bench "$@"
