// Human-readable output: ceilings, one table per run with its aggregate, and progress on stderr.
#pragma once

#include <string>

#include "results.h"

namespace qkbench {

void print_ceilings(const Ceilings& ceilings);
void print_run(const RunResult& run);

// "[3/16] recompute bf16 qksoftmax B=4 H=128 S=512 D=128: timing" on stderr; rewritten in place when stderr
// is a terminal, one line per update otherwise.
class Progress {
 public:
  explicit Progress(int total);
  ~Progress();

  void start_case(const RunResult& run, const Shape& shape);
  void stage(const char* what);
  void clear();  // removes the in-place line (before a table goes to stdout)

 private:
  int total_ = 0;
  int index_ = 0;
  bool tty_ = false;
  bool dirty_ = false;
  std::string prefix_;
};

}  // namespace qkbench
