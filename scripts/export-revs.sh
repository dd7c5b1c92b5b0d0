#!/usr/bin/env bash
# Exports git revisions as source trees into build/revs/<name>, for scripts/gpu-check.sh's stage revs: an A/B
# of whole revisions (kernels that differ in more than a compile-time flag) built and benched side by side in
# one call on the GPU machine, each against the same ceilings. Carry build/revs with the call.
#
#   scripts/export-revs.sh main my-change     # then: run STAGES="revs" scripts/gpu-check.sh, carry .deps build/revs
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: $0 REV [REV...]" >&2; exit 2; }
rm -rf build/revs
for rev in "$@"; do
  name=$(printf '%s' "$rev" | tr -c 'A-Za-z0-9._-' '_')
  mkdir -p "build/revs/$name"
  git archive "$rev" -- . ':!bench/results' ':!docs' | tar -x -C "build/revs/$name"
  git rev-parse --short "$rev" > "build/revs/$name/REVISION"
  echo "build/revs/$name: $rev ($(cat "build/revs/$name/REVISION"))"
done
du -sh build/revs
