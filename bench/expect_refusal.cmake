# Runs qksoftmax-bench --cpu --inject-error and passes only if it exits with status 1 (not a crash) and
# prints FAILED for every mode it ran; with -DTIME_FAILED=ON it adds --time-failed and also requires every failed case
# to be timed all the same (no "us": null in the results file). Usage: cmake -DBENCH=... -DJSON=...
# [-DTIME_FAILED=ON] -P expect_refusal.cmake
set(expected_failures 4)  # --mode all: forward, recompute, recompute_lse, saved_p
set(extra)
if(TIME_FAILED)
  set(extra --time-failed)
endif()
execute_process(
  COMMAND ${BENCH} --cpu --inject-error ${extra} --runs 20 --warmup 3 --json ${JSON}
  RESULT_VARIABLE status
  OUTPUT_VARIABLE out
  ERROR_VARIABLE err)
message("${out}")
if(NOT status EQUAL 1)
  message(FATAL_ERROR "expected exit status 1 from --inject-error, got '${status}'\n${err}")
endif()
string(REGEX MATCHALL "FAILED: " rows "${out}")
list(LENGTH rows failed_rows)
if(NOT failed_rows EQUAL expected_failures)
  message(FATAL_ERROR "expected ${expected_failures} FAILED rows, found ${failed_rows}")
endif()
if(TIME_FAILED)
  file(READ ${JSON} results)
  string(REGEX MATCHALL "\"us\": [0-9]" timed "${results}")
  list(LENGTH timed timed_cases)
  if(NOT timed_cases EQUAL expected_failures OR results MATCHES "\"us\": null")
    message(FATAL_ERROR "--time-failed: expected ${expected_failures} timed cases, found ${timed_cases}")
  endif()
endif()
