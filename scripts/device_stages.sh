# Helpers of the device-call scripts (sp-cluster-check.sh, sp-ab-check.sh, sp-profile-check.sh), sourced after the caller sets OUT
# (where the results go) and BUDGET_S (seconds for the whole call, from here): the logs' folder LOGS, stages run
# within their limit and what is left of the budget, logged to $LOGS/name.log, and a results file's summary.
# shellcheck shell=bash
set -uo pipefail
LOGS=$(mktemp -d)
mkdir -p "$OUT"
export QKSOFTMAX_REQUIRE_GPU=1
start=$SECONDS
left() { echo $((BUDGET_S - (SECONDS - start))); }
skipped() { [[ " ${SKIP:-} " == *" $1 "* ]]; }
# name, limit in seconds, command...
stage() {
  local name=$1 limit=$2 t=$SECONDS rc
  shift 2
  local l
  l=$(left)
  [ "$l" -lt "$limit" ] && limit=$l
  if [ "$limit" -lt 5 ]; then echo "== $name: skipped, the budget is spent"; return 1; fi
  timeout -k 5 "$limit" "$@" > "$LOGS/$name.log" 2>&1
  rc=$?
  echo "== $name: rc $rc, $((SECONDS - t)) s"
  return $rc
}
# The four compute-sanitizer tools on a gtest binary's tests matching a filter (small shapes), each within `limit`
# seconds, their verdicts printed.
sanitize() {
  local bin=$1 filter=$2 limit=$3 tool
  for tool in initcheck memcheck racecheck synccheck; do
    stage "sanitize-$tool" "$limit" env QKSOFTMAX_TEST_SHAPES=small compute-sanitizer --tool $tool --error-exitcode 1 \
      "$bin" --gtest_filter="$filter" --gtest_brief=1
    echo "$tool: $(grep -hE 'PASSED|FAILED|ERROR SUMMARY|RACECHECK SUMMARY' "$LOGS/sanitize-$tool.log" | tr '\n' ' ')"
  done
}
suite() {  # results file: its means and cases, one line per dtype
  python3 - "$1" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["runs"]:
    cases = " ".join(f"{c['B']}x{c['S']}:{c['us']:.1f}" for c in r["cases"])
    print(f"{sys.argv[1].split('/')[-1]} {r['dtype']} mean {r['mean_us']:.1f} us {r['sol_pct']:.1f} % SOL  {cases}")
PY
}
# Each test of a gtest binary (bin) matching a filter run alone within `each` seconds (a hang costs one test's limit,
# and the others still run), its verdict printed: PASSED, FAILED with its failure lines, or TIMEOUT; the outputs
# logged to $LOGS/label.log. Returns 1 if any did not pass.
each_test() {
  local label=$1 bin=$2 filter=$3 each=$4 name status=0 rc
  while read -r name; do
    rc=0
    if [ "$(left)" -lt "$each" ]; then echo "SKIPPED $name (the budget is spent)"; status=1; continue; fi
    timeout -k 2 "$each" "$bin" --gtest_filter="$name" --gtest_brief=1 > "$LOGS/one.log" 2>&1 || rc=$?
    cat "$LOGS/one.log" >> "$LOGS/$label.log"
    if [ $rc -eq 0 ]; then echo "PASSED  $name"; continue; fi
    status=1
    if [ $rc -ge 124 ]; then
      echo "TIMEOUT $name"
    else
      echo "FAILED  $name"
      grep -E "error|furthest|Actual" "$LOGS/one.log" | head -6
    fi
  done < <("$bin" --gtest_filter="$filter" --gtest_list_tests | awk '/^[^ ]/ {s = $1} /^  / {print s $1}')
  return $status
}
