#!/usr/bin/env bash
# One device call for an A/B of the pingpong single pass: builds one tree per variant (AB: "name=CUDA flags"
# entries, ';'-separated; an empty flags part is the control; "name@dir=flags" builds the sources in dir, such as
# an earlier revision's `git archive` under build/, carried), each with its kernel tests, step benchmark and
# bench, in parallel; then per variant: the pingpong kernel tests (GpuSp*: its variants, clusters, dK's stores), the
# step benchmark with its trace (SKIP=step: none), and the seed16 suite in MODE (recompute unless given; causal bf16,
# fp16; unmasked bf16), in turns
# (A B A B…) so that the machine's drift shows as such. At most 8 files come back from a device call: each
# variant's results files (seed16 causal, step) and one log archive go to $OUT (with more than three variants all
# of them in the archive). Builds share
# the 16 cores: three trees with the kernel tests in two of them ran past the 330 s build limit (2026-12-04), so
# with three variants test one (UNTESTED), or run two.
#
#   AB="main=;nopairs=-DQKSOFTMAX_SM90_SP_NO_PAIRS" UNTESTED=nopairs scripts/sp-ab-check.sh   (carry .deps; ~6 min)
#   AB="pairs8=-DQKSOFTMAX_SM90_SP_MAX_CLUSTER=8;main=" UNTESTED=main scripts/sp-ab-check.sh
#   mkdir -p build/head && git archive HEAD | tar -x -C build/head   (then carry .deps and build/head)
#   AB="head@build/head=;new=" UNTESTED=head scripts/sp-ab-check.sh
# A variant packed by scripts/prebuild.sh (build/prebuilt carried: NAME.tar.xz built with the same flags from sources
# that hash the same, scripts/source_hash.sh) is unpacked and run as it is where its binaries start here; otherwise it
# is built here as above (.deps unpacked from the packs' deps.tar.xz where it is not carried). GPU_SUITE=NAME then
# runs that variant's library tests on the GPU ('*Gpu*' of qksoftmax_tests, in one process; prebuild.sh's SUITE packs
# them); SANITIZE=NAME runs that variant's kernel tests (TESTS, small shapes) under compute-sanitizer's four tools.
# shellcheck disable=SC2086,SC2046  # (flags and failed_ok word-split on purpose)
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-out/sp-ab-check}
BUDGET_S=${BUDGET_S:-540}
AB=${AB:-"main=;nopairs=-DQKSOFTMAX_SM90_SP_NO_PAIRS"}
UNTESTED=${UNTESTED:-}  # variants whose kernel tests are skipped (their kernels are another variant's)
SKIP=${SKIP:-}
MODE=${MODE:-recompute}  # the bench's --mode: recompute or saved_p
TESTS=${TESTS:-'*GpuSp*'}  # the kernel tests run per tested variant (saved-P's alone: '*GpuSpSaved*')
BENCH_FAILED=${BENCH_FAILED:-}  # non-empty: variants whose kernel tests fail are benchmarked all the same
PREBUILT_ONLY=${PREBUILT_ONLY:-}  # non-empty: a variant without a pack that runs here stops the call (no build)
TIME_FAILED=${TIME_FAILED:-}  # variants whose results are wrong by design (diagnostic builds): timed all the same
SANITIZE=${SANITIZE:-}  # a tested variant whose kernel tests (TESTS, small shapes) run under compute-sanitizer's tools
GPU_SUITE_FILTER=${GPU_SUITE_FILTER:-'*Gpu*'}
GPU_SUITE=${GPU_SUITE:-}  # a variant whose library tests (qksoftmax_tests, '*Gpu*') run after the rounds (packed: SUITE)
# shellcheck source=scripts/device_stages.sh
source scripts/device_stages.sh
PRE=build/prebuilt
[ -e .deps ] || [ ! -f $PRE/deps.tar.xz ] || tar -xJf $PRE/deps.tar.xz
# Variant NAME's packed tree, built with FLAGS from the sources in SRC (where they are here: the same hash), unpacked
# into build/ab-NAME; true where its binaries start here (the kernel tests too unless UNTESTED).
# Says why where it is not.
prebuilt() {
  local name=$1 flags=$2 src=$3 tree=build/ab-$1
  [ -f "$PRE/$name.tar.xz" ] || { echo "$name: no pack $PRE/$name.tar.xz"; return 1; }
  [ "$(sed -n 1p "$PRE/$name.flags")" = "$flags" ] || { echo "$name: pack built with other flags"; return 1; }
  [ ! -d "$src" ] || [ "$(sed -n 3p "$PRE/$name.flags")" = "$(scripts/source_hash.sh "$src")" ] ||
    { echo "$name: pack from other sources ($(scripts/source_hash.sh "$src") here)"; return 1; }
  rm -rf "$tree"
  mkdir -p "$tree"
  tar -xJf "$PRE/$name.tar.xz" -C "$tree" || { echo "$name: the pack does not unpack"; return 1; }
  "$tree/bench/qksoftmax-bench" --help > /dev/null 2>&1 ||
    { echo "$name: the packed bench does not start:"; "$tree/bench/qksoftmax-bench" --help 2>&1 | head -3; return 1; }
  ! ldd "$tree/bench/qksoftmax-step" | grep "not found" || { echo "$name: the step benchmark's libraries missing"; return 1; }
  skipped tests || [[ " $UNTESTED " == *" $name "* ]] ||
    "$tree/tests/cpp/qksoftmax_kernel_tests" --gtest_list_tests > /dev/null 2>&1 ||
    { echo "$name: the packed kernel tests do not start"; return 1; }
}

failed_ok() { [[ " $TIME_FAILED " != *" $1 "* ]] || echo --time-failed; }

nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
IFS=';' read -r -a variants <<< "$AB"
jobs=$((16 / ${#variants[@]}))
for i in "${!variants[@]}"; do
  name=${variants[$i]%%=*} flags=${variants[$i]#*=} src=.
  if [[ $name == *@* ]]; then src=${name#*@} name=${name%%@*}; fi
  variants[i]="$name=$flags"
  if prebuilt "$name" "$flags" "$src"; then echo "== $name: prebuilt ($(sed -n 2p "$PRE/$name.flags"))"; continue; fi
  [ -z "$PREBUILT_ONLY" ] || { echo "variant $name: no pack runs here (PREBUILT_ONLY)"; exit 1; }
  [ -d "$src" ] || { echo "variant $name: no source tree $src (carry it)"; exit 1; }
  [ -e "$src/.deps" ] || ln -s "$PWD/.deps" "$src/.deps"
  stage "configure-$name" 60 cmake -S "$src" -B "build/ab-$name" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DQKSOFTMAX_BUILD_TESTS=ON -DQKSOFTMAX_BUILD_BENCH=ON -DQKSOFTMAX_BUILD_PYTHON=OFF "-DCMAKE_CUDA_FLAGS=$flags"
  targets="qksoftmax-step qksoftmax-bench"
  skipped tests || [[ " $UNTESTED " == *" $name "* ]] || targets+=" qksoftmax_kernel_tests"
  stage "build-$name" 330 cmake --build "build/ab-$name" -j $jobs --target $targets &
done
wait
grep -hE "error|C7518|spill" "$LOGS"/build-*.log | grep -v "0 bytes spill" | head -5
passed=()
for v in "${variants[@]}"; do
  name=${v%%=*}
  if skipped tests || [[ " $UNTESTED " == *" $name "* ]]; then passed+=("$name"); continue; fi
  if stage "tests-$name" 90 "build/ab-$name/tests/cpp/qksoftmax_kernel_tests" \
    --gtest_filter="$TESTS" --gtest_brief=1 || [ -n "$BENCH_FAILED" ]; then passed+=("$name"); fi
  echo "$name: $(grep -hE 'PASSED|FAILED' "$LOGS/tests-$name.log" | tr '\n' ' ')"
done
for round in 1 2; do
  # (the first round's files in the archive, the second's beside it where at most three variants ran; with more,
  # each round's in the archive under its own name)
  to=$LOGS tag=; [ $round = 2 ] && [ ${#variants[@]} -le 3 ] && to=$OUT
  [ ${#variants[@]} -le 3 ] || tag=-$round
  for name in "${passed[@]}"; do
    if ! skipped step; then
      stage "step-$name-$round" 60 "build/ab-$name/bench/qksoftmax-step" --trace "$to/h200-step-$name$tag.json"
      grep -E "^kb single_pass" "$LOGS/step-$name-$round.log" | sed "s/^/$name $round: /"
    fi
    stage "seed16-$name-$round" 60 "build/ab-$name/bench/qksoftmax-bench" --suite seed16 --mode "$MODE" \
      --dtype bf16,fp16 --impl qksoftmax $(failed_ok "$name") --json "$to/h200-seed16-$name$tag.json" &&
      suite "$to/h200-seed16-$name$tag.json" | sed "s/^/$round: /"
  done
done
for name in "${passed[@]}"; do
  stage "seed16-nomask-$name" 60 "build/ab-$name/bench/qksoftmax-bench" --suite seed16 --mode "$MODE" \
    --dtype bf16 --impl qksoftmax --no-mask $(failed_ok "$name") --json "$LOGS/h200-seed16-nomask-$name.json" &&
    suite "$LOGS/h200-seed16-nomask-$name.json"
done
[ -z "$SANITIZE" ] || sanitize "build/ab-$SANITIZE/tests/cpp/qksoftmax_kernel_tests" "$TESTS" 90
if [ -n "$GPU_SUITE" ]; then
  stage "gpu-suite-$GPU_SUITE" 240 "build/ab-$GPU_SUITE/tests/cpp/qksoftmax_tests" --gtest_filter="$GPU_SUITE_FILTER" \
    --gtest_brief=1
  echo "$GPU_SUITE: $(grep -hE 'PASSED|FAILED|SKIPPED' "$LOGS/gpu-suite-$GPU_SUITE.log" | tr '\n' ' ')"
fi
tar -czf "$OUT/logs.tar.gz" -C "$LOGS" .
