#include "results.h"

#include <algorithm>

namespace qkbench {

namespace {
constexpr double kPercent = 100;
}

Aggregate aggregate(const RunResult& run) {
  Aggregate a;
  if (run.cases.empty()) return a;
  double sum_us = 0, sum_sol = 0;
  bool all_sol = true;
  for (const CaseResult& c : run.cases) {
    if (!c.us) return a;
    sum_us += *c.us;
    if (c.sol_us)
      sum_sol += *c.sol_us;
    else
      all_sol = false;
  }
  a.sum_us = sum_us;
  a.mean_us = sum_us / double(run.cases.size());
  if (all_sol && sum_us > 0) {
    a.sum_sol_us = sum_sol;
    a.sol_pct = kPercent * sum_sol / sum_us;
  }
  return a;
}

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  const size_t mid = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + mid, values.end());
  if (values.size() % 2) return values[mid];
  const double upper = values[mid];
  const double lower = *std::max_element(values.begin(), values.begin() + mid);
  return (lower + upper) / 2;
}

bool Report::all_passed() const {
  for (const RunResult& run : runs)
    for (const CaseResult& c : run.cases)
      if (!c.passed()) return false;
  return true;
}

}  // namespace qkbench
