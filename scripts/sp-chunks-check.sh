#!/usr/bin/env bash
# One device call for the chunk schedule (docs/DESIGN.md, "The chunk schedule"): builds the kernel tests and the
# bench with causal rows in clusters of 2, 4 and 8 by the chunk schedule (-DQKSOFTMAX_SM90_SP_CHUNKS, every cluster
# size dispatched); runs each chunk-schedule kernel test alone (a hang costs one test's limit), the contiguous
# cluster tests, the seed16 recompute suite causal (bf16, fp16), and racecheck, synccheck and memcheck on the chunk
# tests (small shapes) where they passed. At most 8 files come back from a device call: the results file and one
# log archive go to $OUT.
#
#   scripts/sp-chunks-check.sh            (carry .deps; about 7 minutes on the H200's 16 cores)
# shellcheck disable=SC2086
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-out/sp-chunks-check}
BUDGET_S=${BUDGET_S:-500}
# shellcheck source=scripts/device_stages.sh
source scripts/device_stages.sh

nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
stage configure 60 cmake -S . -B build/spck -G Ninja -DCMAKE_BUILD_TYPE=Release -DQKSOFTMAX_BUILD_TESTS=ON \
  -DQKSOFTMAX_BUILD_BENCH=ON -DQKSOFTMAX_BUILD_PYTHON=OFF \
  "-DCMAKE_CUDA_FLAGS=-DQKSOFTMAX_SM90_SP_MAX_CLUSTER=8 -DQKSOFTMAX_SM90_SP_CHUNKS"
stage build 330 cmake --build build/spck -j 16 --target qksoftmax_kernel_tests qksoftmax-bench
grep -hE "error|C751|spill" "$LOGS"/build.log | grep -v "0 bytes spill" | head -5
kernel_tests=build/spck/tests/cpp/qksoftmax_kernel_tests
each_test chunk-tests $kernel_tests '*GpuSpChunks*' 20
chunks_pass=$?
stage cluster-tests 45 $kernel_tests --gtest_filter='*GpuSpCluster*' --gtest_brief=1
grep -E "PASSED|FAILED" "$LOGS/cluster-tests.log"
if [ $chunks_pass -eq 0 ]; then
  stage seed16-chunks 60 build/spck/bench/qksoftmax-bench --suite seed16 --mode recompute --dtype bf16,fp16 \
    --impl qksoftmax --json "$OUT/h200-seed16-causal-chunks.json" && suite "$OUT/h200-seed16-causal-chunks.json"
fi
for tool in racecheck synccheck memcheck; do
  stage "sanitize-$tool" 150 env QKSOFTMAX_TEST_SHAPES=small compute-sanitizer --tool $tool --error-exitcode 1 \
    $kernel_tests --gtest_filter='*GpuSpChunks*' &
done
wait
for tool in racecheck synccheck memcheck; do
  echo "$tool: $(grep -hE 'ERROR SUMMARY|PASSED|FAILED|RACE|Barrier' "$LOGS/sanitize-$tool.log" | sort | uniq -c | head -5 | tr '\n' ' ')"
done
tar -czf "$OUT/logs.tar.gz" -C "$LOGS" .
