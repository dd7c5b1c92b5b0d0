#!/usr/bin/env bash
# One hash of the sources a build tree is made from (DIR, default the repository): the build files, headers, sources,
# benchmark (not its results) and tests, by relative path and content. scripts/prebuild.sh records it with a pack, and
# scripts/sp-ab-check.sh runs a pack only where its sources hash the same there (paths in the C locale's order: the
# device sorts them otherwise in its own).
set -euo pipefail
cd "${1:-$(dirname "$0")/..}"
find CMakeLists.txt cmake include src bench tests -type f ! -path 'bench/results/*' ! -path '*/__pycache__/*' ! -path '*/.*' -print0 | LC_ALL=C sort -z |
  LC_ALL=C xargs -0 sha256sum | sha256sum | cut -c1-16
