// What a bench run found: per case, per run (suite × mode × dtype × impl), and for the whole report.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "model.h"

namespace qkbench {

// The relative Frobenius error of one output of the checked slice against the fp64 reference.
struct OutputError {
  std::string name;  // "dQ", "dK", "P", "LSE"
  double rel_error = 0;
};

struct CaseResult {
  Shape shape;
  Cost cost;                      // SOL-model bytes and flops
  std::optional<double> us;       // median time per call; absent when the case failed
  std::optional<double> host_us;  // median host time to enqueue a call (GPU runs only)
  std::optional<double> sol_us;   // absent without ceilings (CPU backend)
  std::vector<OutputError> errors;
  std::string failure;            // why no time is reported: the check's verdict or the error met
  int copies = 0;                 // input sets the timed calls rotate over

  bool passed() const { return failure.empty(); }
};

// What a run is: the cases of a suite in one mode, dtype and implementation.
struct RunKey {
  std::string suite;
  Mode mode = Mode::kRecompute;
  DType dtype = DType::kBFloat16;
  std::string impl;
};

struct RunResult : RunKey {
  std::vector<CaseResult> cases;
};

// Suite % SOL = Σ SOL time / Σ measured time, and the mean time; both absent unless every case has a time
// (and, for % SOL, a SOL time): a partial sum would not compare with other runs.
struct Aggregate {
  std::optional<double> mean_us;
  std::optional<double> sol_pct;
  std::optional<double> sum_us;
  std::optional<double> sum_sol_us;
};

Aggregate aggregate(const RunResult& run);

// The median of values (the mean of the two middle ones for an even count; 0 when empty).
double median(std::vector<double> values);

// Called with the stage a case is in ("making inputs", "checking ...", "timing").
using StageFn = std::function<void(const char* stage)>;

struct Environment {
  std::string gpu;
  std::string date;
  std::string command;
  std::optional<Ceilings> ceilings;  // absent on the CPU backend
  int64_t l2_bytes = 0;
  int sms = 0;
  std::string cuda_runtime;
  std::string library_version;
  Mask mask = Mask::kCausal;
  int runs = 0;
  int warmup = 0;
  bool inject_error = false;
};

struct Report {
  Environment env;
  std::vector<RunResult> runs;

  bool all_passed() const;
};

}  // namespace qkbench
