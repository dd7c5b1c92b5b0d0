# Runs qksoftmax-bench --cpu --inject-error and passes only if it exits with status 1 (not a crash) and
# prints FAILED for every mode it ran. Usage: cmake -DBENCH=... -DJSON=... -P expect_refusal.cmake
set(expected_failures 4)  # --mode all: forward, recompute, recompute_lse, saved_p
execute_process(
  COMMAND ${BENCH} --cpu --inject-error --runs 20 --warmup 3 --json ${JSON}
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
