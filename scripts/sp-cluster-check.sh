#!/usr/bin/env bash
# One device call for the single pass in clusters (docs/DESIGN.md, "Rows of up to 1024 keys: clusters"): builds the
# tree (tests and benchmarks) and, beside it, the bench with every cluster size dispatched
# (-DQKSOFTMAX_SM90_SP_MAX_CLUSTER=8) and with causal heads one at a time instead of in mirrored pairs
# (-DQKSOFTMAX_SM90_SP_NO_PAIRS too); runs the cluster kernel tests, the four sanitizers on them (small shapes), the
# step benchmark with its trace, the seed16 recompute suite causal (bf16, fp16) and unmasked (bf16) from the first
# two builds and causal from the third, and the GPU tests (ctest) in what is left of the budget. At most 8 files
# come back from a device call: the results files and one log archive go to $OUT.
#
#   scripts/sp-cluster-check.sh            (carry .deps; about 8 minutes on the H200's 16 cores)
#   BUDGET_S=500 SKIP="ctest sanitize" scripts/sp-cluster-check.sh
# SKIP="variants" leaves out the two variant builds and their runs; the tree then builds on all 16 cores, and the
# sanitizers run beside ctest. TESTS_FILTER (default: every pingpong kernel test) picks the kernel tests that run
# and that the sanitizers check.
#   BUDGET_S=500 SKIP="variants" scripts/sp-cluster-check.sh
# shellcheck disable=SC2086
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-out/sp-cluster-check}
BUDGET_S=${BUDGET_S:-540}
SKIP=${SKIP:-}
TESTS_FILTER=${TESTS_FILTER:-'*GpuSp*'}
# shellcheck source=scripts/device_stages.sh
source scripts/device_stages.sh

nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
stage configure 60 cmake -S . -B build/spc -G Ninja -DCMAKE_BUILD_TYPE=Release -DQKSOFTMAX_BUILD_TESTS=ON \
  -DQKSOFTMAX_BUILD_BENCH=ON -DQKSOFTMAX_BUILD_PYTHON=OFF
skipped variants || stage configure-c8 60 cmake -S . -B build/spc8 -G Ninja -DCMAKE_BUILD_TYPE=Release -DQKSOFTMAX_BUILD_TESTS=OFF \
  -DQKSOFTMAX_BUILD_BENCH=ON -DQKSOFTMAX_BUILD_PYTHON=OFF -DCMAKE_CUDA_FLAGS=-DQKSOFTMAX_SM90_SP_MAX_CLUSTER=8
skipped variants || stage configure-nopairs 60 cmake -S . -B build/spnp -G Ninja -DCMAKE_BUILD_TYPE=Release -DQKSOFTMAX_BUILD_TESTS=OFF \
  -DQKSOFTMAX_BUILD_BENCH=ON -DQKSOFTMAX_BUILD_PYTHON=OFF \
  "-DCMAKE_CUDA_FLAGS=-DQKSOFTMAX_SM90_SP_MAX_CLUSTER=8 -DQKSOFTMAX_SM90_SP_NO_PAIRS"
jobs=16
if ! skipped variants; then
  jobs=10
  stage build-c8 300 cmake --build build/spc8 -j 4 --target qksoftmax-bench &
  stage build-nopairs 300 cmake --build build/spnp -j 4 --target qksoftmax-bench &
fi
stage build 300 cmake --build build/spc -j $jobs --target qksoftmax_tests qksoftmax_kernel_tests qksoftmax-step \
  qksoftmax-bench
wait
grep -hE "error|C7518|spill" "$LOGS"/build*.log | grep -v "0 bytes spill" | grep -v bwd_kernel | head -5
kernel_tests=build/spc/tests/cpp/qksoftmax_kernel_tests
stage sp-tests 60 $kernel_tests --gtest_filter="$TESTS_FILTER" --gtest_brief=1
grep -E "PASSED|FAILED" "$LOGS/sp-tests.log"
stage step 90 build/spc/bench/qksoftmax-step --trace "$OUT/h200-step.json"
grep -E "^kb single_pass" "$LOGS/step.log"
for mask in causal nomask; do
  flag=; [ $mask = nomask ] && flag=--no-mask
  dtypes=bf16,fp16; [ $mask = nomask ] && dtypes=bf16
  stage "seed16-$mask" 60 build/spc/bench/qksoftmax-bench --suite seed16 --mode recompute --dtype $dtypes \
    --impl qksoftmax $flag --json "$OUT/h200-seed16-$mask.json" && suite "$OUT/h200-seed16-$mask.json"
  skipped variants || stage "seed16-$mask-c8" 60 build/spc8/bench/qksoftmax-bench --suite seed16 --mode recompute --dtype bf16 \
    --impl qksoftmax $flag --json "$OUT/h200-seed16-$mask-c8.json" && suite "$OUT/h200-seed16-$mask-c8.json"
done
# Causal rows in clusters of every size, heads one at a time.
skipped variants || stage seed16-nopairs 60 build/spnp/bench/qksoftmax-bench --suite seed16 --mode recompute --dtype bf16 \
  --impl qksoftmax --json "$OUT/h200-seed16-causal-nopairs.json" && suite "$OUT/h200-seed16-causal-nopairs.json"
if ! skipped sanitize; then
  for tool in memcheck racecheck synccheck initcheck; do
    stage "sanitize-$tool" 200 env QKSOFTMAX_TEST_SHAPES=small compute-sanitizer --tool $tool --error-exitcode 1 \
      $kernel_tests --gtest_filter="$TESTS_FILTER" &
  done
  skipped variants || wait  # (with the variants left out, beside ctest)
fi
if ! skipped ctest; then
  stage ctest 300 ctest --test-dir build/spc -j 14 --timeout 100 -E 'IndexingPast2To31|api_fuzz_cpu|stress_cpu'
  grep -E "tests passed|tests failed|\*\*\*Failed|Timeout" "$LOGS/ctest.log" | head -12
fi
wait
if ! skipped sanitize; then
  for tool in memcheck racecheck synccheck initcheck; do
    echo "$tool: $(grep -hE 'ERROR SUMMARY|PASSED|FAILED' "$LOGS/sanitize-$tool.log" | tr '\n' ' ')"
  done
fi
tar -czf "$OUT/logs.tar.gz" -C "$LOGS" .
