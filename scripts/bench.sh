#!/usr/bin/env bash
# Builds qksoftmax-bench (in the one build tree, scripts/build.sh) and runs it: on the GPU if there is one,
# else the CPU backend on a small case.
#   scripts/bench.sh --suite seed16 --mode all      # any qksoftmax-bench options
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh
exec build/bench/qksoftmax-bench "$@"
