# Runs qksoftmax-bench --cpu twice, its stdout and stderr merged in the order written (as in a pipe to a log):
# a small case, whose output must start with the CPU notice (before any progress) and which must pass; and
# --suite seed16, which the CPU path must refuse with exit status 1 and a message naming --suite.
# Usage: cmake -DBENCH=... -DJSON=... -P expect_cpu_notice.cmake
set(notice "--cpu: running the CPU backend")
execute_process(
  COMMAND ${BENCH} --cpu --mode forward --runs 20 --warmup 3 --json ${JSON}
  RESULT_VARIABLE status
  OUTPUT_VARIABLE out
  ERROR_VARIABLE out)
message("${out}")
if(NOT status EQUAL 0)
  message(FATAL_ERROR "expected exit status 0 from the small CPU case, got '${status}'")
endif()
string(FIND "${out}" "${notice}" at)
if(NOT at EQUAL 0)
  message(FATAL_ERROR "expected the output to start with '${notice}', found it at ${at}")
endif()

execute_process(
  COMMAND ${BENCH} --cpu --suite seed16 --runs 20 --warmup 3 --json ${JSON}
  RESULT_VARIABLE status
  OUTPUT_VARIABLE out
  ERROR_VARIABLE out)
message("${out}")
if(NOT status EQUAL 1)
  message(FATAL_ERROR "expected exit status 1 from --cpu --suite seed16, got '${status}'")
endif()
if(NOT out MATCHES "--suite seed16: the suites run on a CUDA GPU")
  message(FATAL_ERROR "expected the refusal of --suite in the output")
endif()
