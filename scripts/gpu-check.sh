#!/usr/bin/env bash
# One call on the GPU machine (no network): build on all cores, run every test with the GPU active,
# benchmark (with the PyTorch peers), compute-sanitizer (memcheck, racecheck, synccheck) on a representative subset,
# read registers/spills and SASS. Results and a log archive go to $OUT; a short table is printed last.
#
#   scripts/gpu-check.sh                        # all stages
#   STAGES="build ctest" scripts/gpu-check.sh   # some
#   STAGES="build ctest pytest ddp" scripts/gpu-check.sh   # on two GPUs: the device tests and the DDP step
#   BUDGET_S=540 scripts/gpu-check.sh           # stages after the budget are cut short, the summary still prints
#   STAGES="build bench ab" AB_CUDA_FLAGS="-DKNOB=3;-DKNOB=4" scripts/gpu-check.sh
#                                               # A/B: the bench again from a build per ';'-separated variant
#   scripts/export-revs.sh main my-branch; STAGES="revs" scripts/gpu-check.sh   (carry .deps and build/revs)
#                                               # A/B of whole revisions: each built, then benched in turns
#   STAGES="build sanitize-all stress fuzz" CMAKE_ARGS=-DQKSOFTMAX_BUILD_BENCH=OFF SANITIZE_SHARDS=6 \
#     SANITIZE_SHARDS_RACECHECK=12 SANITIZE_SECONDS=330 STRESS_SECONDS=20 FUZZ_SECONDS=20 BUDGET_S=585 scripts/gpu-check.sh
#                                               # reliability: every sanitizer over the whole GPU test suite,
#                                               # the stress run, the API fuzzer; counts in h200-reliability.json
#                                               # (about 8 minutes: the build, then the three by their limits)
#   REVS_SMOKE_FILTER='*GpuVsCpu*S264x264_D128*' REVS_TEST_FILTER='*GpuVsCpu*:*GpuPlan*' STAGES="revs" \
#     scripts/gpu-check.sh                      # the same, each tree's GPU
#                                               # tests of that filter first (a failing tree is not benched)
#   STAGES="revs kernels" REVS_ROUNDS=0 PROFILE_BENCHES="a=build/gpu-rev-a/bench/qksoftmax-bench" \
#     PROFILE_LAUNCHES=3 scripts/gpu-check.sh    # each backward kernel's time and DRAM bytes, per revision
#   STAGES="build crash" scripts/gpu-check.sh   # a native backtrace of one pytest test (CRASH_TEST) that crashes
#   STAGES="micro" scripts/gpu-check.sh         # the products of a step by shape against cuBLAS (qksoftmax-wgmma)
#   STAGES="build kernel-tests" scripts/gpu-check.sh   # kernels through internal entry points (qksoftmax_kernel_tests)
#
# Needs .deps/ (scripts/deps.sh, run where there is network; carry it with the call).
# shellcheck disable=SC2086
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/gpu-check}
STAGES=${STAGES:-"build smoke ctest step bench peers host hf sanitize sass profile pytest"}
BUDGET_S=${BUDGET_S:-100000}
CMAKE_ARGS=${CMAKE_ARGS:-}
CTEST_ARGS=${CTEST_ARGS:-}  # e.g. "-R D128" for the Hopper cases only
# A representative subset under the sanitizers: every dtype, mask and mode at a tail size (generic and Hopper
# paths), GQA, strided layouts.
SANITIZE_FILTER=${SANITIZE_FILTER:-'*GpuVsCpu*S65x65_D64*:*GpuVsCpu*S136x136_D128*:*GpuVsCpu*S200x200*:*H4x1_S129x129*:*GpuVsCpu*S264x264_D128*:*GpuVsCpu*S1032x264*:*GpuForwardWithoutLse*:*GpuManyItems*S512x512*'}
# stage sanitize-all: every tool over the whole test suite (the tests' shapes shrunk where size serves only
# volume, QKSOFTMAX_TEST_SHAPES=small), each tool in SANITIZE_SHARDS shards, all tools and shards at once, for
# at most SANITIZE_SECONDS (less where the budget must keep time for the stress and fuzz stages after it): a
# shard still running then is stopped and counted as incomplete, with the tests it finished.
SANITIZE_TOOLS=${SANITIZE_TOOLS:-"memcheck racecheck synccheck initcheck"}
SANITIZE_SHARDS=${SANITIZE_SHARDS:-4}
# racecheck is the slowest tool. Shards beyond the cores slow every shard: on the H200 host (16 cores) 6 shards
# of each other tool and 12 of racecheck ran every test in 291 s; 16 of racecheck left 8 shards unfinished at 266 s.
SANITIZE_SHARDS_RACECHECK=${SANITIZE_SHARDS_RACECHECK:-$SANITIZE_SHARDS}
SANITIZE_ALL_FILTER=${SANITIZE_ALL_FILTER:-'*'}
SANITIZE_SECONDS=${SANITIZE_SECONDS:-210}
# tool:pattern pairs: tests a tool leaves out (GoogleTest negative patterns). IndexingPast2To31Elements serves
# size alone (9 GB of P and dP, past 2^31 elements): memcheck, which sees an offset that overflows as an
# out-of-bounds access, runs it; the shared-memory, barrier and initialisation tools, which would track every
# access of its 2.2e9-element kernels, see no kernel or tail path in it that the other tests do not run.
# Racecheck (5-15x slower than the other tools) also leaves out the families that add only volume or values on
# kernels and tail paths that Sweep and Edges already run: Items (every block of a large grid), Heads (many
# items per launch), Bias (values with a large common part) and GpuDeterminism (two runs compared bit for bit,
# the single pass at S = 1000 and 512); a shared-memory hazard is within a CTA or a cluster, whatever the grid.
SANITIZE_SKIP=${SANITIZE_SKIP:-"racecheck:*IndexingPast2To31Elements* racecheck:Items/*:Heads/*:Bias/*:Modes/GpuDeterminism.* synccheck:*IndexingPast2To31Elements* initcheck:*IndexingPast2To31Elements*"}
STRESS_SECONDS=${STRESS_SECONDS:-60}    # stage stress: the concurrent phase (then graphs, repeats, memory)
STRESS_THREADS=${STRESS_THREADS:-4}
STRESS_EXTRA_S=${STRESS_EXTRA_S:-90}    # the stress run's limit past STRESS_SECONDS: the other phases, a hang
FUZZ_ITERATIONS=${FUZZ_ITERATIONS:-3000}  # stage fuzz: calls on device memory (and as many on the host),
FUZZ_SECONDS=${FUZZ_SECONDS:-60}          # for at most this long on each
# stage crash (before sanitize-all): one pytest test, alone and after the test files before its own, under gdb
# where it is installed, for the native backtrace of a crash; each run at most CRASH_SECONDS.
CRASH_TEST=${CRASH_TEST:-"tests/python/test_misuse.py::test_bad_call[op forward scale nan]"}
CRASH_SECONDS=${CRASH_SECONDS:-120}
# A few cases of each Hopper kernel, run first under a short timeout: a hang shows here, not in ctest.
SMOKE_FILTER=${SMOKE_FILTER:-'*GpuVsCpu*S520x520_D128*:*GpuVsCpu*S1024x1024_D128*:*GpuVsCpu*S120x120_D128*:*GpuForwardWithoutLse*:*ForwardManyItemsRepeated*'}
# ncu: the Hopper kernels of seed16 cases, in each mode (the bench's calls are not deterministic: the two-pass
# backward). Per-source-line tables: scripts/ncu_lines.py on the saved CSVs.
PROFILE_CASES=${PROFILE_CASES:-"4,128,512,128 4,128,1024,128"}
PROFILE_MODES=${PROFILE_MODES:-"recompute saved_p forward"}
# The backward's kernels profiled, PROFILE_LAUNCHES launches of them from the first call (3: the row statistics,
# the key-block or column pass and the conversion of the two-pass backward).
PROFILE_KERNELS=${PROFILE_KERNELS:-'bwd_kernel|colpass|kb_kernel|rowstats|convert_dq'}
PROFILE_LAUNCHES=${PROFILE_LAUNCHES:-1}
KERNEL_CASES=${KERNEL_CASES:-"1,16,1024,128 1,16,1024,128,nomask 8,128,1024,128"}  # stage kernels: its cases,
KERNEL_MODES=${KERNEL_MODES:-"recompute saved_p"}                                       # modes and launches
KERNEL_LAUNCHES=${KERNEL_LAUNCHES:-3}  # (the two-pass backward: row statistics, key-block pass (the column pass in older revisions), conversion)
PROFILE_IMPL=${PROFILE_IMPL:-qksoftmax}  # qksoftmax_deterministic: the single pass at every Sk ≤ 1024
BENCH_ARGS=${BENCH_ARGS:-"--suite all --mode all --dtype bf16"}
STEP_ARGS=${STEP_ARGS:-}  # stage step: "--trace" adds each case's cycles per step by phase and role
# stage ab: ';'-separated CUDA flags, a build and a bench (BENCH_ARGS) each into $OUT/ab<i>.json; an empty
# variant (";-DX=1") is a control build without flags. CMAKE_ARGS apply too, before the variant's flags.
AB_CUDA_FLAGS=${AB_CUDA_FLAGS:-}
# stage revs: the trees of scripts/export-revs.sh, each built (bench only) and benched with BENCH_ARGS into
# $OUT/rev-<name>-<round>.json, REVS_ROUNDS rounds in turns (A B A B: drift of the machine shows as such).
REVS_ROUNDS=${REVS_ROUNDS:-2}
REVS_TIMEOUT_S=${REVS_TIMEOUT_S:-420}  # one bench or step run of one tree at most (a kernel that hangs)
# REVS_STEP=1: each tree's step micro-benchmark too (STEP_ARGS), after its bench in every round.
REVS_STEP=${REVS_STEP:-0}
# REVS_TEST_FILTER: each tree's GPU tests too (built with the bench), those of this GoogleTest filter, once
# before the rounds: a revision that fails them is not benched.
REVS_TEST_FILTER=${REVS_TEST_FILTER:-}
# REVS_NO_TESTS: names of trees (space-separated) whose tests REVS_TEST_FILTER skips, e.g. "main" (proved already)
REVS_NO_TESTS=${REVS_NO_TESTS:-}
# REVS_SMOKE_FILTER: a few GPU tests run first on each tested tree, for at most REVS_SMOKE_S seconds: a kernel
# that hangs costs that, not REVS_TIMEOUT_S, and its tree is neither tested further nor benched.
REVS_SMOKE_FILTER=${REVS_SMOKE_FILTER:-}
REVS_SMOKE_S=${REVS_SMOKE_S:-60}
BENCH_TARGETS="qksoftmax-bench"
[ "$REVS_STEP" = 1 ] && BENCH_TARGETS="qksoftmax-bench qksoftmax-step"
PEER_ARGS=${PEER_ARGS:-"--suite seed16 --dtype bf16 --impl eager,compile,autograd,eager_fwd,compile_fwd,eager_fwd_bwd,compile_fwd_bwd,qksoftmax_fwd_bwd,qksoftmax_p_fwd_bwd"}
BUILD=build/gpu
LOGS=$OUT/logs
# The reliability stages' counts, kept in the build tree between calls on one machine and merged into
# $OUT/h200-reliability.json by every call that has any (so sanitize-all and stress may run in two calls).
RELIABILITY=build/reliability
mkdir -p "$LOGS"
export PYTHONUNBUFFERED=1
export QKSOFTMAX_REQUIRE_GPU=1  # here a missing GPU fails the GPU tests instead of skipping them

# STOP_ON_FAIL=1: after a failed stage the rest is skipped (the summary still prints): no device time on
# stages that a broken build or a hang makes meaningless.
STOP_ON_FAIL=${STOP_ON_FAIL:-0}
SMOKE_TIMEOUT_S=${SMOKE_TIMEOUT_S:-90}
declare -a summary
failed=0
record() {
  summary+=("$(printf '%-10s %-6s %s' "$1" "$2" "$3")")
  [ "$2" = FAIL ] && failed=1
  return 0
}
has_stage() { [[ " $STAGES " == *" $1 "* ]] && ! { [ "$STOP_ON_FAIL" = 1 ] && [ "$failed" = 1 ]; }; }
left() { echo $((BUDGET_S - SECONDS > 1 ? BUDGET_S - SECONDS : 1)); }
# The budget of a step that may take at most $1 seconds (BUDGET_S=$(within N) run_logged ...).
within() { echo $((SECONDS + $1 < BUDGET_S ? SECONDS + $1 : BUDGET_S)); }
# The summary of a qksoftmax-step log ($1): µs per step and tensor share of the single pass at C = 8 and of the
# key-block pass with dQ in bf16 (its default), per mode (a log without key-block rows, an older revision's,
# gives the single pass's alone).
step_summary() {
  { grep -E '^recompute +8 |^saved_p +8 ' "$1" | awk '{print $1 " C=8 " $4 " us " $5}'
    grep -E '^kb +(recompute|saved_p) +bf16 ' "$1" | awk '{print "kb " $2 " " $5 " us " $7}'
  } | paste -sd' '
}
run_logged() {  # name, command...: runs within the budget, tees to $LOGS/name.log, returns the command's status
  local name=$1; shift
  echo "=== $name: $*"
  timeout -k 10 "$(left)" "$@" 2>&1 | tee "$LOGS/$name.log"
  return "${PIPESTATUS[0]}"
}
last_line() { grep -E "$1" "$2" 2>/dev/null | tail -1; }
# A bench-only Release build: log name, source tree, build folder, extra cmake arguments.
build_bench() {
  local name=$1 src=$2 dir=$3; shift 3
  run_logged "$name-configure" cmake -S "$src" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DQKSOFTMAX_BUILD_TESTS=OFF -DQKSOFTMAX_BUILD_BENCH=ON -DQKSOFTMAX_BUILD_PYTHON=OFF $CMAKE_ARGS "$@" &&
    run_logged "$name-build" cmake --build "$dir" -j "${BUILD_JOBS:-$(nproc)}" --target $BENCH_TARGETS
}

{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.limit --format=csv; nvcc --version | tail -1;
  python3 -c 'import torch; print("torch", torch.__version__)'; date -u +%FT%TZ; } > "$LOGS/env.txt" 2>&1
cat "$LOGS/env.txt"

if has_stage build; then
  t0=$SECONDS
  if run_logged configure cmake -S . -B $BUILD -G Ninja -DCMAKE_BUILD_TYPE=Release -DQKSOFTMAX_BUILD_TESTS=ON \
        -DQKSOFTMAX_BUILD_BENCH=ON -DQKSOFTMAX_BUILD_PYTHON=ON -DPython_EXECUTABLE="$(command -v python3)" $CMAKE_ARGS &&
     run_logged build cmake --build $BUILD -j "$(nproc)"; then
    record build ok "$((SECONDS - t0)) s"
  else
    record build FAIL "see logs/build.log"
  fi
fi

# stage kernel-tests: the kernel tests (qksoftmax_kernel_tests: kernels through internal entry points, e.g. the
# single pass against the CPU backend and against a second run of itself), KERNEL_TESTS_FILTER of them, at most
# SMOKE_TIMEOUT_S.
if has_stage kernel-tests; then
  kernel_tests_bin=$(find $BUILD -name qksoftmax_kernel_tests -type f | head -1)
  if [ -z "$kernel_tests_bin" ]; then
    record kernel-tests FAIL "no qksoftmax_kernel_tests in $BUILD (a CUDA build with tests)"
  elif BUDGET_S=$(within "$SMOKE_TIMEOUT_S") run_logged kernel-tests "$kernel_tests_bin" \
         --gtest_filter="${KERNEL_TESTS_FILTER:-*}" --gtest_brief=1; then
    record kernel-tests ok "$(last_line 'PASSED' "$LOGS/kernel-tests.log")"
  else
    record kernel-tests FAIL "$(last_line 'PASSED|FAILED' "$LOGS/kernel-tests.log") (see logs/kernel-tests.log)"
  fi
fi
if has_stage smoke; then
  tests_bin=$(find $BUILD -name qksoftmax_tests -type f | head -1)
  BUDGET_S=$((SECONDS + SMOKE_TIMEOUT_S)) run_logged smoke "$tests_bin" --gtest_filter="$SMOKE_FILTER" --gtest_brief=1
  rc=$?
  if [ $rc = 0 ]; then
    record smoke ok "$(last_line 'PASSED' "$LOGS/smoke.log")"
  elif [ $rc = 124 ]; then
    record smoke FAIL "timed out after ${SMOKE_TIMEOUT_S} s: a hang (see logs/smoke.log)"
  else
    # Failed tests, not a hang: later stages still say something (STOP_ON_FAIL stops only at a hang).
    summary+=("$(printf '%-10s %-6s %s' smoke FAIL "$(last_line 'PASSED|FAILED' "$LOGS/smoke.log") rc $rc (see logs/smoke.log)")")
  fi
fi

if has_stage ctest; then
  if run_logged ctest ctest --test-dir $BUILD --output-on-failure --timeout 120 -j 8 $CTEST_ARGS; then
    record ctest ok "$(last_line 'tests passed' "$LOGS/ctest.log")"
  else
    record ctest FAIL "$(last_line 'tests passed|tests failed' "$LOGS/ctest.log")"
  fi
fi

# The step micro-benchmarks of the single-pass backward and of the two-pass backward's key-block pass
# (L2-resident; µs per step and SM, tensor-pipe share), both in h200-step.json.
if has_stage step; then
  step_bin=$(find $BUILD -name qksoftmax-step -type f | head -1)
  if run_logged step "$step_bin" $STEP_ARGS "$OUT/h200-step.json"; then
    record step ok "$(step_summary "$LOGS/step.log")"
  else
    record step FAIL "see logs/step.log"
  fi
  # DSMEM push and bulk reduce-add into L2 at once, each against its rate alone (the next design's question).
  exchange_bin=$(find $BUILD -name qksoftmax-exchange -type f | head -1)
  if [ -n "$exchange_bin" ]; then
    if run_logged exchange "$exchange_bin" "$OUT/h200-exchange.json"; then
      record exchange ok "$(last_line '^exchange:' "$LOGS/exchange.log" | sed 's/^exchange: //')"
    else
      record exchange FAIL "see logs/exchange.log"
    fi
  fi
fi

if has_stage micro; then  # the product-rate micro-benchmark alone: its own bench-only build (about a minute)
  if BENCH_TARGETS=qksoftmax-wgmma build_bench micro . build/gpu-micro &&
     run_logged wgmma build/gpu-micro/bench/qksoftmax-wgmma "$OUT/h200-wgmma.json"; then
    record micro ok "$(grep -E '^(SS|RS) n(64|128) x2' "$LOGS/wgmma.log" | awk '{print $1 "/" $2 "/" $4 " " $(NF-1)}' | paste -sd' ')"
  else
    record micro FAIL "see logs/micro-*.log, logs/wgmma.log"
  fi
fi

if has_stage bench; then
  bench_bin=$(find $BUILD -name qksoftmax-bench -type f | head -1)
  if run_logged bench "$bench_bin" $BENCH_ARGS --json "$OUT/h200.json"; then
    record bench ok "$(grep -c '^suite' "$LOGS/bench.log") suite tables"
  else
    record bench FAIL "$(grep -c FAILED "$LOGS/bench.log") FAILED lines, see logs/bench.log"
  fi
fi

if has_stage ab; then
  if [ -z "$AB_CUDA_FLAGS" ]; then
    record ab FAIL "stage ab needs AB_CUDA_FLAGS"
  fi
  IFS=';' read -r -a ab_variants <<< "$AB_CUDA_FLAGS"
  for i in "${!ab_variants[@]}"; do
    flags=${ab_variants[$i]}; n=$((i + 1))
    if build_bench "ab$n" . "build/gpu-ab$n" -DCMAKE_CUDA_FLAGS="$flags" &&
       run_logged "ab$n" "build/gpu-ab$n/bench/qksoftmax-bench" $BENCH_ARGS --json "$OUT/ab$n.json"; then
      record "ab$n" ok "${flags:-(no flags)}: $(grep -c '^suite' "$LOGS/ab$n.log") suite tables, ab$n.json"
    else
      record "ab$n" FAIL "${flags:-(no flags)}: see logs/ab$n*.log"
    fi
  done
fi

if has_stage revs; then
  # The trees build at once: a tree's build ends on a few long files, which the other trees' files fill
  # around. Twice the cores in compilers over all trees (CUTLASS instances take 1-2 GB each).
  revs=()
  names=()
  pids=()
  trees=(build/revs/*/)
  jobs=$(( 2 * $(nproc) / ${#trees[@]} > 2 ? 2 * $(nproc) / ${#trees[@]} : 2 ))
  rev_targets=$BENCH_TARGETS
  rev_tests=()
  if [ -n "$REVS_TEST_FILTER" ]; then
    rev_targets="$BENCH_TARGETS qksoftmax_tests"
    rev_tests=(-DQKSOFTMAX_BUILD_TESTS=ON)
  fi
  tested() { [ -n "$REVS_TEST_FILTER" ] && [[ " $REVS_NO_TESTS " != *" $1 "* ]]; }
  for tree in "${trees[@]}"; do
    name=$(basename "$tree")
    names+=("$name")
    targets=$BENCH_TARGETS
    flags=()
    if tested "$name"; then
      ln -sfn "$PWD/.deps" "$tree/.deps"  # the tests' GoogleTest
      targets=$rev_targets
      flags=("${rev_tests[@]}")
    fi
    BENCH_TARGETS=$targets BUILD_JOBS=$jobs build_bench "rev-$name" "$tree" "build/gpu-rev-$name" \
        -DQKSOFTMAX_CUTLASS_INCLUDE_DIR="$PWD/.deps/cutlass/include" "${flags[@]}" > /dev/null &
    pids+=($!)
  done
  # A tree's GPU tests of a filter within a number of seconds, logged as rev-TREE-KIND:
  #   rev_gtest TREE KIND FILTER SECONDS
  rev_gtest() {
    BUDGET_S=$(within "$4") run_logged "rev-$1-$2" "build/gpu-rev-$1/tests/cpp/qksoftmax_tests" --gtest_filter="$3" \
        --gtest_brief=1
  }
  for i in "${!names[@]}"; do
    name=${names[$i]}
    if ! wait "${pids[$i]}"; then
      record "rev $name" FAIL "build: see logs/rev-$name-*.log"
    elif ! tested "$name"; then
      revs+=("$name")
    elif [ -n "$REVS_SMOKE_FILTER" ] && ! rev_gtest "$name" smoke "$REVS_SMOKE_FILTER" "$REVS_SMOKE_S"; then
      record "rev $name smoke" FAIL "failed or past ${REVS_SMOKE_S} s: see logs/rev-$name-smoke.log"
    elif rev_gtest "$name" tests "$REVS_TEST_FILTER" "$REVS_TIMEOUT_S"; then
      record "rev $name tests" ok "$(grep -E '^\[  PASSED  \]|SKIPPED \]' "$LOGS/rev-$name-tests.log" | head -2 | paste -sd' ')"
      revs+=("$name")
    else
      record "rev $name tests" FAIL "$(grep -cE '^\[  FAILED  \]' "$LOGS/rev-$name-tests.log") lines of failures: see logs/rev-$name-tests.log"
    fi
  done
  for round in $(seq 1 "$REVS_ROUNDS"); do
    for name in "${revs[@]}"; do
      if BUDGET_S=$(within "$REVS_TIMEOUT_S") run_logged "rev-$name-$round" "build/gpu-rev-$name/bench/qksoftmax-bench" \
            $BENCH_ARGS --json "$OUT/rev-$name-$round.json"; then
        means=$(grep -E '^suite' "$LOGS/rev-$name-$round.log" | sed -E 's/.*mean ([0-9.]+ us).*/\1/' | paste -sd' ')
        record "rev $round" ok "$name ($(cat "build/revs/$name/REVISION" 2>/dev/null)): $means"
      else
        record "rev $round" FAIL "$name: see logs/rev-$name-$round.log"
      fi
      if [ "$REVS_STEP" = 1 ]; then
        if BUDGET_S=$(within "$REVS_TIMEOUT_S") run_logged "rev-$name-step-$round" \
              "build/gpu-rev-$name/bench/qksoftmax-step" $STEP_ARGS \
              "$OUT/rev-$name-step-$round.json"; then
          record "step $round" ok "$name: $(step_summary "$LOGS/rev-$name-step-$round.log")"
        else
          record "step $round" FAIL "$name: see logs/rev-$name-step-$round.log"
        fi
      fi
    done
  done
  # The revisions' phase traces side by side (round 1, C = 8), where the step ran with --trace.
  if [ "$REVS_STEP" = 1 ] && [[ " $STEP_ARGS " == *" --trace "* ]]; then
    pairs=()
    for name in "${revs[@]}"; do pairs+=("$name=$LOGS/rev-$name-step-1.log"); done
    for mode in recompute saved_p; do
      python3 scripts/trace_table.py --mode $mode --cluster 8 "${pairs[@]}" >> "$LOGS/rev-trace.log" 2>&1
    done
    cat "$LOGS/rev-trace.log"
    record trace info "the revisions' phases side by side: logs/rev-trace.log"
  fi
fi

if has_stage peers; then
  if PYTHONPATH=python run_logged peers python3 bench/torch_peers.py --json "$OUT/h200.json" $PEER_ARGS; then
    record peers ok ""
  else
    record peers FAIL "see logs/peers.log"
  fi
fi
if has_stage sanitize; then
  tests_bin=$(find $BUILD -name qksoftmax_tests -type f | head -1)
  for tool in ${SANITIZE_TOOLS:-memcheck racecheck synccheck}; do
    if run_logged "sanitize-$tool" compute-sanitizer --tool $tool --error-exitcode 1 "$tests_bin" \
          --gtest_filter="$SANITIZE_FILTER" --gtest_brief=1; then
      record $tool ok "$(last_line 'ERROR SUMMARY|RACECHECK SUMMARY' "$LOGS/sanitize-$tool.log")"
    else
      record $tool FAIL "$(last_line 'ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED' "$LOGS/sanitize-$tool.log")"
    fi
  done
fi

if has_stage crash; then
  # A test that crashes the interpreter: under gdb (the native backtrace of the crashing thread and of every
  # thread, the shared libraries' addresses, then Python's own trace from its fault handler), or the fault
  # handler alone where there is no gdb. First the test alone; where that does not crash, every test file of
  # its folder up to its own in pytest's order, for a crash that needs the state the tests before it leave.
  t0=$SECONDS
  crash_file=${CRASH_TEST%%::*}
  crash_run() {  # log name, pytest arguments...
    local name=$1; shift
    local python=(python3 -X faulthandler -m pytest "$@" -v -p no:cacheprovider)
    if command -v gdb > /dev/null; then
      python=(gdb -q -batch -ex 'set pagination off' -ex 'handle SIGPIPE nostop noprint' -ex run -ex bt
              -ex 'thread apply all bt 30' -ex 'info sharedlibrary' -ex continue --args "${python[@]}")
    fi
    BUDGET_S=$(within "$CRASH_SECONDS") PYTHONPATH=python run_logged "$name" "${python[@]}"
  }
  crashed() { grep -q -E 'Fatal Python error|received signal|terminated with signal' "$LOGS"/crash-*.log; }
  outcome() {  # log name, exit status: how the test process ended (gdb's own status says nothing of it)
    local seen
    seen=$(grep -h -o -E 'received signal [A-Z]+|exited normally|exited with code [0-9]+' "$LOGS/$1.log" | head -1)
    echo "${seen:-rc $2}"
  }
  crash_run crash-test "$CRASH_TEST"
  steps="alone: $(outcome crash-test $?)"
  if ! crashed; then
    files=()
    for f in "$(dirname "$crash_file")"/test_*.py; do
      files+=("$f")
      [ "$f" = "$crash_file" ] && break
    done
    crash_run crash-files "${files[@]}"
    steps+=", ${#files[@]} files: $(outcome crash-files $?)"
  fi
  command -v gdb > /dev/null || steps+=" (no gdb)"
  signal=$(grep -h -E 'Fatal Python error|received signal|terminated with signal' "$LOGS"/crash-*.log | head -1)
  record crash info "$steps, $((SECONDS - t0)) s: ${signal:-no crash}"
fi

if has_stage sanitize-all; then
  tests_bin=$(find $BUILD -name qksoftmax_tests -type f | head -1)
  mkdir -p "$RELIABILITY" "$LOGS/sanitize-all"
  rm -f "$LOGS"/sanitize-all/*
  # The stages after this one keep their time: stress (its concurrent phase and ~30 s) and fuzz (~20 s past its
  # limit on the device, the host run), and 15 s for the summary.
  later=15
  has_stage stress && later=$((later + STRESS_SECONDS + 30))
  has_stage fuzz && later=$((later + FUZZ_SECONDS + 20))
  limit=$(($(left) - later < SANITIZE_SECONDS ? $(left) - later : SANITIZE_SECONDS))
  [ "$limit" -lt 1 ] && limit=1
  suite_counts=""
  shard_counts=""
  t0=$SECONDS
  for tool in $SANITIZE_TOOLS; do
    shards=$SANITIZE_SHARDS
    [ "$tool" = racecheck ] && shards=$SANITIZE_SHARDS_RACECHECK
    shard_counts+="$tool=$shards "
    leak=""
    [ "$tool" = memcheck ] && leak="--leak-check full"
    filter=$SANITIZE_ALL_FILTER
    skipped=""
    read -r -a skip_pairs <<< "$SANITIZE_SKIP"  # (not a loop over $SANITIZE_SKIP: its patterns would glob)
    for pair in "${skip_pairs[@]}"; do [ "${pair%%:*}" = "$tool" ] && skipped+="${skipped:+:}${pair#*:}"; done
    if [ -n "$skipped" ]; then [[ $filter == *-* ]] && filter+=":$skipped" || filter+="-$skipped"; fi
    count=$(QKSOFTMAX_TEST_SHAPES=small "$tests_bin" --gtest_filter="$filter" --gtest_list_tests | grep -c '^  ')
    suite_counts+="$tool=$count "
    echo "=== sanitize-all: $tool over $count tests ($filter), $shards shards, at most $limit s"
    for shard in $(seq 0 $((shards - 1))); do
      name=$LOGS/sanitize-all/sanitize-all-$tool-$shard
      # Not --gtest_brief: every test's line with its time, so that a shard stopped at the limit still says
      # which tests it finished, and the log says which tests take the time under each tool.
      ( QKSOFTMAX_TEST_SHAPES=small QKSOFTMAX_TEST_RESET_DEVICE=1 GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$shard \
          timeout -k 10 "$limit" compute-sanitizer --tool "$tool" $leak --error-exitcode 1 "$tests_bin" \
          --gtest_filter="$filter" --gtest_output="json:$name.json" > "$name.log" 2>&1
        echo $? > "$name.rc" ) &
    done
  done
  wait
  if python3 scripts/reliability.py sanitize "$LOGS/sanitize-all" "$suite_counts" "$shard_counts" \
       $((SECONDS - t0)) "$RELIABILITY/sanitize.json" > "$LOGS/sanitize-all.log" 2>&1; then
    while read -r line; do
      tool=${line%%:*}
      if [[ $line == *": clean:"* ]]; then record "$tool" ok "${line#*: clean: }"; else record "$tool" FAIL "${line#*: }"; fi
    done < "$LOGS/sanitize-all.log"
  else
    record sanitize FAIL "see logs/sanitize-all.log"
  fi
fi

if has_stage stress; then
  stress_bin=$(find $BUILD -name qksoftmax_stress -type f | head -1)
  mkdir -p "$RELIABILITY"
  rm -f "$LOGS/stress-counts.json"  # rewritten after each test: no older file may stand for this run
  limit=$((STRESS_SECONDS + STRESS_EXTRA_S))
  QKSOFTMAX_STRESS_SECONDS=$STRESS_SECONDS QKSOFTMAX_STRESS_THREADS=$STRESS_THREADS \
    QKSOFTMAX_STRESS_JSON="$LOGS/stress-counts.json" BUDGET_S=$(within "$limit") \
    run_logged stress "$stress_bin"
  status=$?
  python3 scripts/reliability.py stress "$LOGS/stress-counts.json" "$status" "$STRESS_SECONDS" \
    "$STRESS_THREADS" "$RELIABILITY/stress.json" > "$LOGS/stress-summary.log" 2>&1
  if [ "$status" -eq 0 ]; then record stress ok "$(cat "$LOGS/stress-summary.log")"; else record stress FAIL "$(cat "$LOGS/stress-summary.log")"; fi
fi

if has_stage fuzz; then
  fuzz_bin=$(find $BUILD -name qksoftmax_fuzz -type f | head -1)
  mkdir -p "$RELIABILITY"
  for device in cuda cpu; do
    json=$RELIABILITY/fuzz-$device.json
    rm -f "$json"  # a crash leaves none, not an older one
    BUDGET_S=$(within $((FUZZ_SECONDS + 20))) \
      run_logged "fuzz-$device" "$fuzz_bin" --device $device --iterations "$FUZZ_ITERATIONS" \
      --seconds "$FUZZ_SECONDS" --seed 1 --json "$json"
    status=$?
    python3 scripts/reliability.py fuzz "$device" "$status" "$json" >> "$LOGS/fuzz-$device.log" 2>&1
    if [ "$status" -eq 0 ]; then
      record "fuzz $device" ok "$(last_line '^fuzz' "$LOGS/fuzz-$device.log")"
    else
      record "fuzz $device" FAIL "rc $status: $(last_line '^fuzz|qksoftmax_fuzz' "$LOGS/fuzz-$device.log")"
    fi
  done
fi

if has_stage sass; then
  lib=$(find $BUILD -maxdepth 1 -name 'libqksoftmax.so*' -type f | head -1)
  cuobjdump --dump-sass "$lib" > "$LOGS/sass.txt" 2>&1
  cuobjdump --dump-resource-usage "$lib" > "$LOGS/resource-usage.txt" 2>&1
  record sass info "HGMMA $(grep -c HGMMA "$LOGS/sass.txt") HMMA $(grep -c 'HMMA' "$LOGS/sass.txt") LDL/STL $(grep -cE '\b(LDL|STL)\b' "$LOGS/sass.txt")"
  # ptxas notes that wgmma instructions were serialised (C75xx: a call, a divergent path or a wait crossing
  # them) cost the overlap the Hopper kernels are built on: any is a defect to fix.
  serialised=$(grep -c 'wgmma.mma_async instructions are serialized' "$LOGS/build.log" 2>/dev/null)
  if [ "${serialised:-0}" -eq 0 ]; then record wgmma ok "no serialised wgmma (ptxas)"; else record wgmma FAIL "$serialised ptxas notes of serialised wgmma, see logs/build.log"; fi
fi

if has_stage profile; then
  # Full ncu sets with source-level stall sampling of the Hopper kernels; the reports come back in
  # $OUT (open with ncu-ui or `ncu --import`), their details and the hottest SASS lines as text in the logs.
  # PROFILE_BENCHES: name=binary pairs (a revs tree's bench: rev=build/gpu-rev-rev/bench/qksoftmax-bench),
  # else this tree's build.
  benches=${PROFILE_BENCHES:-"$(find $BUILD -name qksoftmax-bench -type f | head -1)"}
  for bench in $benches; do
  tag=${bench%%=*}
  bench_bin=${bench#*=}
  [ "$tag" = "$bench" ] && tag=""
  for case in $PROFILE_CASES; do
    for mode in $PROFILE_MODES; do
      # (saved-P inputs come from the forward: that mode's filter must not take the forward kernel)
      kernels="regex:$PROFILE_KERNELS"
      [ "$mode" = forward ] && kernels='regex:forward_(stripe_)?kernel'
      name="ncu${tag:+-$tag}-$mode-S$(echo "$case" | cut -d, -f3)"
      run_logged "$name" ncu --clock-control none --set full --import-source yes \
        -k "$kernels" --launch-count "$PROFILE_LAUNCHES" -f -o "$OUT/$name" \
        "$bench_bin" --case "$case" --mode $mode --impl "$PROFILE_IMPL" --runs 20 --warmup 3
      ncu --import "$OUT/$name.ncu-rep" --page details --print-details all > "$LOGS/$name-details.log" 2>&1
      ncu --import "$OUT/$name.ncu-rep" --page source --print-source sass --csv > "$LOGS/$name-sass.csv" 2>&1
      # the consumer warps' stall reasons, where the kernel is warp-specialised (the single pass)
      python3 scripts/ncu_stalls.py "$LOGS/$name-sass.csv" > "$LOGS/$name-stalls.log" 2>&1 || true
      # each kernel's executed instructions: opcodes and the heaviest straight-line runs
      python3 scripts/ncu_blocks.py "$LOGS/$name-sass.csv" > "$LOGS/$name-blocks.log" 2>&1 || true
    done
  done
  done
  record profile info "$(cat "$LOGS"/ncu-*-details.log 2>/dev/null | grep -c 'Section: GPU Speed Of Light') kernel reports, ncu-*.ncu-rep"
fi

if has_stage kernels; then
  # Each backward kernel's time and DRAM bytes (ncu, caches as the previous kernel left them, each pass of a
  # kernel after the kernels before it, so that a pass's second read shows as an L2 hit): KERNEL_CASES are
  # B,H,S,D or B,H,S,D,nomask; a table per bench in logs/kernels.log.
  benches=${PROFILE_BENCHES:-"$(find $BUILD -name qksoftmax-bench -type f | head -1)"}
  kernels_failed=0
  for bench in $benches; do
    tag=${bench%%=*}
    bench_bin=${bench#*=}
    [ "$tag" = "$bench" ] && tag=main
    for case in $KERNEL_CASES; do
      shape=$(echo "$case" | cut -d, -f1-4)
      mask=""
      [[ "$case" == *,nomask ]] && mask=--no-mask
      for mode in $KERNEL_MODES; do
        name="kernels-$tag-$mode-$(echo "$case" | tr ',' '_')"
        if ! run_logged "$name" ncu --clock-control none --cache-control none --replay-mode application \
              --print-units base --section SpeedOfLight --metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum \
              -k "regex:$PROFILE_KERNELS" --launch-count "$KERNEL_LAUNCHES" --csv --page details \
              "$bench_bin" --case "$shape" $mask --mode $mode --impl "$PROFILE_IMPL" --runs 20 --warmup 3 \
              > "$LOGS/$name.csv"; then
          kernels_failed=1
        fi
        python3 scripts/ncu_kernels.py --title "$tag $mode $case" "$LOGS/$name.csv" >> "$LOGS/kernels.log" 2>&1 ||
          kernels_failed=1
      done
    done
  done
  cat "$LOGS/kernels.log"
  if [ "$kernels_failed" = 0 ]; then record kernels info "per-kernel times: logs/kernels.log"
  else record kernels FAIL "see logs/kernels*"; fi
fi

if has_stage host; then  # host time per call of each layer of the torch path (docs/PYTORCH.md, "Host time")
  if PYTHONPATH=python run_logged host python3 bench/host_time.py --json "$OUT/h200-host.json"; then
    record host info "$(grep 'goal' "$LOGS/host.log" | sed -E 's/ +/ /g' | paste -sd ';')"
  else
    record host FAIL "see logs/host.log"
  fi
fi

if has_stage hf; then  # the transformers attention backend: its test, and a training step against eager attention
  if PYTHONPATH=python run_logged hf-test python3 -m pytest tests/python/test_transformers.py -q -rs -p no:cacheprovider &&
     PYTHONPATH=python run_logged hf python3 bench/transformers_step.py --json "$OUT/h200-transformers.json"; then
    record hf info "$(grep 'vs eager' "$LOGS/hf.log" | sed -E 's/ +/ /g' | paste -sd ';')"
  else
    record hf FAIL "see logs/hf-test.log, logs/hf.log"
  fi
fi

if has_stage ddp; then  # two GPUs or more: a data-parallel training step against the same step on one GPU
  if PYTHONPATH=python run_logged ddp python3 examples/ddp_step.py --json "$OUT/h200-ddp.json"; then
    record ddp ok "$(tail -1 "$LOGS/ddp.log")"
  else
    record ddp FAIL "see logs/ddp.log"
  fi
fi

if has_stage pytest; then
  if PYTHONPATH=python run_logged pytest python3 -m pytest tests/python -q -rs -p no:cacheprovider; then
    record pytest ok "$(tail -1 "$LOGS/pytest.log")"
  else
    record pytest FAIL "$(tail -1 "$LOGS/pytest.log")"
  fi
fi

if [ -f "$OUT/h200.json" ]; then
  python3 bench/plot.py "$OUT/h200.json" > "$LOGS/plot.log" 2>&1 || record plot FAIL "see logs/plot.log"
fi

if [ -d "$RELIABILITY" ]; then
  python3 scripts/reliability.py merge "$RELIABILITY" "$LOGS/env.txt" "$OUT/h200-reliability.json" ||
    record reliability FAIL "merge of the counts failed"
fi

tar -czf "$OUT/logs.tar.gz" -C "$OUT" logs && rm -rf "$LOGS"
echo
echo "==================== gpu-check summary ($(date -u +%FT%TZ), ${SECONDS} s) ===================="
printf '%s\n' "${summary[@]}"
for line in "${summary[@]}"; do [[ $line == *" FAIL "* ]] && exit 1; done
exit 0
