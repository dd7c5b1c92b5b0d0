#!/usr/bin/env bash
# One device call for the dispatched backward as it stands: builds the tree (tests and benchmarks); runs the seed16
# suite in each of MODES (recompute and saved_p unless given) causal (bf16, fp16) and unmasked (bf16), the pingpong single pass's kernel tests, ncu's full set
# on the kernels that seed16's causal cases spend their time in (the pingpong single pass in clusters of eight at
# S = 1024, of four at S = 512 and of two at S = 256; B = 8, H = 128), with
# each report's speed-of-light lines and the consumers' stall reasons printed, and the GPU tests (ctest) in what is
# left of the budget. A profile's fifth field is the bench's mode (recompute unless given). At most 8 files come back
# from a device call: two results files per mode, one report (the last profile's, by name) and one log archive go to
# $OUT.
#
#   scripts/sp-profile-check.sh            (carry .deps; about 9 minutes on the H200's 16 cores)
#   BUDGET_S=400 SKIP="ctest" scripts/sp-profile-check.sh
#   SANITIZE='*GpuSpSavedP*' SKIP="profile" scripts/sp-profile-check.sh   (those kernel tests under compute-sanitizer)
# CUDA_FLAGS builds the tree with those flags (an A/B knob such as -DQKSOFTMAX_SM90_SP_MAX_CLUSTER=8) and, with the
# tests skipped (SKIP="tests ctest"), the bench alone; PROFILES replaces the profiled kernels ("name case regex
# launches", ';'-separated).
#   BUDGET_S=200 SKIP="tests seed16 ctest" CUDA_FLAGS=-DQKSOFTMAX_SM90_SP_MAX_CLUSTER=8 \
#     PROFILES="sp-c8-S1024 8,128,1024,128 sp_pp_kernel 1" scripts/sp-profile-check.sh
# shellcheck disable=SC2086
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-out/sp-profile-check}
BUDGET_S=${BUDGET_S:-540}
SKIP=${SKIP:-}
MODES=${MODES:-"recompute saved_p"}
CUDA_FLAGS=${CUDA_FLAGS:-}
PROFILES=${PROFILES:-"sp-c8-S1024 8,128,1024,128 sp_pp_kernel 1;sp-c4-S512 8,128,512,128 sp_pp_kernel 1;\
sp-c2-S256 8,128,256,128 sp_pp_kernel 1"}
# shellcheck source=scripts/device_stages.sh
source scripts/device_stages.sh
REPORTS=$(mktemp -d)  # ncu's reports: the last profile's comes back

nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
tests=ON targets=()
skipped tests && skipped ctest && tests=OFF targets=(--target qksoftmax-bench)
stage configure 60 cmake -S . -B build/spp -G Ninja -DCMAKE_BUILD_TYPE=Release -DQKSOFTMAX_BUILD_TESTS=$tests \
  -DQKSOFTMAX_BUILD_BENCH=ON -DQKSOFTMAX_BUILD_PYTHON=OFF "-DCMAKE_CUDA_FLAGS=$CUDA_FLAGS"
stage build 300 cmake --build build/spp -j 16 "${targets[@]}"
grep -hE "error|C7518|spill" "$LOGS"/build.log | grep -v "0 bytes spill" | head -5
bench=build/spp/bench/qksoftmax-bench
skipped seed16 || for mode in $MODES; do
  for mask in causal nomask; do
    flag=; [ $mask = nomask ] && flag=--no-mask
    dtypes=bf16,fp16; [ $mask = nomask ] && dtypes=bf16
    stage "seed16-$mode-$mask" 60 $bench --suite seed16 --mode "$mode" --dtype $dtypes --impl qksoftmax $flag \
      --json "$OUT/h200-seed16-$mode-$mask.json" && suite "$OUT/h200-seed16-$mode-$mask.json"
  done
done
if ! skipped tests; then
  stage sp-tests 90 build/spp/tests/cpp/qksoftmax_kernel_tests --gtest_filter='*GpuSp*' \
    --gtest_brief=1
  grep -E "PASSED|FAILED" "$LOGS/sp-tests.log"
fi
if ! skipped profile; then
  # name, case (B,H,S,D), kernels (ncu's regex), launches, mode (recompute unless given)
  IFS=';' read -r -a profiles <<< "$PROFILES"
  for profile in "${profiles[@]}"; do
    read -r name shape kernels launches mode <<< "$profile"
    stage "ncu-$name" 120 ncu --clock-control none --set full --import-source yes -k "regex:$kernels" \
      --launch-count "$launches" -f -o "$REPORTS/ncu-$name" $bench --case "$shape" --mode "${mode:-recompute}" \
      --impl qksoftmax --runs 20 --warmup 3 || continue
    ncu --import "$REPORTS/ncu-$name.ncu-rep" --page details --print-details all > "$LOGS/ncu-$name-details.log" 2>&1
    ncu --import "$REPORTS/ncu-$name.ncu-rep" --page source --print-source sass --csv > "$LOGS/ncu-$name-sass.csv" 2>&1
    echo "-- ncu $name ($shape)"
    grep -E "^  [a-z_]+kernel|Duration  |SM Frequency|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|L2 Cache Throughput|Issue Slots Busy|No Eligible|Registers Per Thread|Achieved Occupancy" \
      "$LOGS/ncu-$name-details.log" | sed -E 's/ +/ /g' | head -40
    python3 scripts/ncu_stalls.py "$LOGS/ncu-$name-sass.csv" --top 12 2>&1 | head -40 | tee "$LOGS/ncu-$name-stalls.log"
  done
  last=$(find "$REPORTS" -name '*.ncu-rep' | sort | tail -1)
  [ -n "$last" ] && cp "$last" "$OUT/"
fi
# SANITIZE: a gtest filter of kernel tests run under compute-sanitizer's four tools (small shapes), before ctest.
if [ -n "${SANITIZE:-}" ] && ! skipped tests; then
  sanitize build/spp/tests/cpp/qksoftmax_kernel_tests "$SANITIZE" 80
fi
if ! skipped ctest; then
  stage ctest 300 ctest --test-dir build/spp -j 14 --timeout 100 -E 'IndexingPast2To31|api_fuzz_cpu|stress_cpu'
  grep -E "tests passed|tests failed|\*\*\*Failed|Timeout|Not Run" "$LOGS/ctest.log" | head -12
fi
tar -czf "$OUT/logs.tar.gz" -C "$LOGS" .
