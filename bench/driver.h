// The loop over runs (suite × dtype × mode × impl) and their cases, shared by the GPU and CPU paths:
// progress on stderr, a table per run on stdout, results into the report.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "cli.h"
#include "results.h"
#include "tensors.h"

namespace qkbench {

struct RunPlan : RunKey {
  std::vector<Shape> shapes;
};

// The suites the options name: the --case shapes as suite "custom" when given, else --suite.
std::vector<Suite> selected_suites(const CliOptions& options);

// Every (suite, dtype, mode, impl) of the options, in that nesting order, where supports(impl, mode).
std::vector<RunPlan> plan_runs(const std::vector<Suite>& suites, const CliOptions& options,
                               const std::vector<std::string>& impls,
                               const std::function<bool(const std::string& impl, Mode mode)>& supports);

// Runs one case; stage(...) reports progress within it.
using CaseFn = std::function<CaseResult(const RunPlan& run, const CaseSpec& spec, const StageFn& stage)>;

void run_plans(const std::vector<RunPlan>& plans, Mask mask, const CaseFn& run_case, Report* report);

}  // namespace qkbench
