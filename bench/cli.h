// The command line of qksoftmax-bench.
#pragma once

#include <string>
#include <vector>

#include "model.h"
#include "result.h"

namespace qkbench {

inline constexpr const char* kImplQkSoftmax = "qksoftmax";
inline constexpr const char* kImplQkSoftmaxDeterministic = "qksoftmax_deterministic";
inline constexpr const char* kImplCublasUnfused = "cublas_unfused";

struct CliOptions {
  std::string suite = "seed16";
  bool suite_given = false;  // --suite was on the command line (the CPU path runs no suite, and says so)
  std::vector<Shape> cases;  // --case: replaces the suite (reported as suite "custom")
  std::vector<Mode> modes;
  std::vector<DType> dtypes;
  std::vector<std::string> impls;  // of kImplQkSoftmax, kImplQkSoftmaxDeterministic, kImplCublasUnfused
  Mask mask = Mask::kCausal;
  std::string json_path;
  std::string command;  // the command line, as run
  int runs = 0;
  int warmup = 0;
  bool inject_error = false;
  bool time_failed = false;  // failed cases timed all the same (diagnostic builds)
  bool force_cpu = false;
  bool plot = false;
  bool help = false;
};

// Fills *out from argv. A usage error is returned as a Result naming the argument.
Result parse_cli(int argc, char** argv, CliOptions* out);

std::string usage();

// The bench's source folder (where plot.py lives) and the default JSON path.
std::string bench_source_dir();

}  // namespace qkbench
