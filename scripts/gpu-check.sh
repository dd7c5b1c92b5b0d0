#!/usr/bin/env bash
# One call on the GPU machine (no network): build on all cores, run every test with the GPU active,
# compute-sanitizer (memcheck, racecheck) on a representative subset, read registers/spills and SASS,
# benchmark with the PyTorch peers. Full logs go to $OUT; a short table is printed last.
#
#   scripts/gpu-check.sh                 # all stages
#   STAGES="build test" scripts/gpu-check.sh
#   BENCH_ARGS="--suite all --mode all --dtype all" scripts/gpu-check.sh
#
# Needs .deps/ (scripts/deps.sh, run where there is network; carry it with the call).
# shellcheck disable=SC2086
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/gpu-check}
STAGES=${STAGES:-"build ctest pytest sanitize sass bench peers"}
CMAKE_ARGS=${CMAKE_ARGS:-}
# A representative subset under the sanitizers: every dtype, mask and mode at a tail size, strided layouts.
SANITIZE_FILTER=${SANITIZE_FILTER:-'*GpuVsCpu*S65x65_D64*:*GpuVsCpu*S200x200*:GpuTest.ForwardWithoutLse'}
BENCH_ARGS=${BENCH_ARGS:-"--suite all --mode all --dtype bf16"}
PEER_ARGS=${PEER_ARGS:-"--suite all --dtype bf16"}
BUILD=build/gpu
LOGS=$OUT/logs
mkdir -p "$LOGS"
export PYTHONUNBUFFERED=1

declare -a summary
record() { summary+=("$(printf '%-10s %-6s %s' "$1" "$2" "$3")"); }
has_stage() { [[ " $STAGES " == *" $1 "* ]]; }
run_logged() {  # name, command...: runs, tees to $LOGS/name.log, returns the command's status
  local name=$1; shift
  echo "=== $name: $*"
  "$@" 2>&1 | tee "$LOGS/$name.log"
  return "${PIPESTATUS[0]}"
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

if has_stage ctest; then
  if run_logged ctest ctest --test-dir $BUILD --output-on-failure --timeout 600 -j 8; then
    record ctest ok "$(grep -E 'tests passed' "$LOGS/ctest.log" | tail -1)"
  else
    record ctest FAIL "$(grep -E 'tests passed|tests failed' "$LOGS/ctest.log" | tail -1)"
  fi
fi

if has_stage pytest; then
  if PYTHONPATH=python run_logged pytest python3 -m pytest tests/python -q -rs; then
    record pytest ok "$(tail -1 "$LOGS/pytest.log")"
  else
    record pytest FAIL "$(tail -1 "$LOGS/pytest.log")"
  fi
fi

if has_stage sanitize; then
  tests_bin=$(find $BUILD -name qksoftmax_tests -type f | head -1)
  for tool in memcheck racecheck; do
    if run_logged "sanitize-$tool" compute-sanitizer --tool $tool --error-exitcode 1 "$tests_bin" \
          --gtest_filter="$SANITIZE_FILTER" --gtest_brief=1; then
      record $tool ok "$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$LOGS/sanitize-$tool.log" | tail -1)"
    else
      record $tool FAIL "$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$LOGS/sanitize-$tool.log" | tail -1)"
    fi
  done
fi

if has_stage sass; then
  lib=$(find $BUILD -maxdepth 1 -name 'libqksoftmax.so*' -type f | head -1)
  cuobjdump --dump-sass "$lib" > "$LOGS/sass.txt" 2>&1
  cuobjdump --dump-resource-usage "$lib" > "$LOGS/resource-usage.txt" 2>&1
  record sass info "HGMMA $(grep -c HGMMA "$LOGS/sass.txt") HMMA $(grep -c 'HMMA' "$LOGS/sass.txt") LDL/STL $(grep -cE '\b(LDL|STL)\b' "$LOGS/sass.txt")"
fi

if has_stage bench; then
  bench_bin=$(find $BUILD -name qksoftmax-bench -type f | head -1)
  # shellcheck disable=SC2086
  if run_logged bench "$bench_bin" $BENCH_ARGS --json "$OUT/h200.json"; then
    record bench ok "$(grep -iE 'aggregate|suite' "$LOGS/bench.log" | tail -3 | tr '\n' ' ')"
  else
    record bench FAIL "see logs/bench.log"
  fi
fi

if has_stage peers; then
  # shellcheck disable=SC2086
  if run_logged peers python3 bench/torch_peers.py --json "$OUT/h200.json" $PEER_ARGS; then
    record peers ok ""
  else
    record peers FAIL "see logs/peers.log"
  fi
  python3 bench/plot.py "$OUT/h200.json" > "$LOGS/plot.log" 2>&1 && cp "$OUT"/h200-*.png "$OUT/" 2>/dev/null
fi

tar -czf "$OUT/logs.tar.gz" -C "$OUT" logs && rm -rf "$LOGS"
echo
echo "==================== gpu-check summary ($(date -u +%FT%TZ)) ===================="
printf '%s\n' "${summary[@]}"
for line in "${summary[@]}"; do [[ $line == *" FAIL "* ]] && exit 1; done
exit 0
