#!/usr/bin/env bash
# One device call that times the pingpong single pass without parts of its traffic (QKSOFTMAX_SM90_SP_DIAG,
# sp_pp_config.h: results wrong, so the bench runs with --time-failed): one tree built with the knob, whose kernels
# are the committed ones while the variable is unset; the pingpong kernel tests (GpuSp*) and the step benchmark
# on it as they stand; then the seed16 suite (causal, bf16) for each DIAGS entry "mode:bits" in two rounds
# (A B C … A B C …), so that the machine's drift shows as such. The results files and logs come back in one
# archive, the second round's summaries in the log.
#
#   scripts/sp-diag-check.sh          (carry .deps; about 7 minutes on the H200's 16 cores)
#   DIAGS="saved_p:0 saved_p:2" SKIP="tests step" scripts/sp-diag-check.sh
# shellcheck disable=SC2086
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-out/sp-diag-check}
BUDGET_S=${BUDGET_S:-500}
SKIP=${SKIP:-}
DIAGS=${DIAGS:-"saved_p:0 saved_p:1 saved_p:2 saved_p:4 saved_p:8 saved_p:6 recompute:0 recompute:2 recompute:4"}
# shellcheck source=scripts/device_stages.sh
source scripts/device_stages.sh

nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
stage configure 60 cmake -S . -B build/diag -G Ninja -DCMAKE_BUILD_TYPE=Release -DQKSOFTMAX_BUILD_TESTS=ON \
  -DQKSOFTMAX_BUILD_BENCH=ON -DQKSOFTMAX_BUILD_PYTHON=OFF -DCMAKE_CUDA_FLAGS=-DQKSOFTMAX_SM90_SP_DIAG
targets="qksoftmax-step qksoftmax-bench"
skipped tests || targets+=" qksoftmax_kernel_tests"
stage build 300 cmake --build build/diag -j 16 --target $targets
grep -hE "error|C7518|spill" "$LOGS"/build.log | grep -v "0 bytes spill" | head -5
if ! skipped tests; then
  stage sp-tests 90 build/diag/tests/cpp/qksoftmax_kernel_tests --gtest_filter='*GpuSp*' --gtest_brief=1
  grep -E "PASSED|FAILED" "$LOGS/sp-tests.log"
fi
if ! skipped step; then
  stage step 90 build/diag/bench/qksoftmax-step --trace "$LOGS/h200-step.json"
  grep -E "^kb single_pass" "$LOGS/step.log"
fi
for round in 1 2; do
  for d in $DIAGS; do
    mode=${d%%:*} bits=${d#*:} name="${d/:/-}-$round"
    QKSOFTMAX_SM90_SP_DIAG=$bits stage "seed16-$name" 60 build/diag/bench/qksoftmax-bench --suite seed16 \
      --mode "$mode" --dtype bf16 --impl qksoftmax --time-failed --json "$LOGS/h200-seed16-$name.json"
    suite "$LOGS/h200-seed16-$name.json" | sed "s/^/$mode diag $bits round $round: /"
  done
done
tar -czf "$OUT/logs.tar.gz" -C "$LOGS" .
