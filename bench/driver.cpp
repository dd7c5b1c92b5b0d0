#include "driver.h"

#include "report.h"

namespace qkbench {

std::vector<Suite> selected_suites(const CliOptions& options) {
  if (!options.cases.empty()) return {Suite{"custom", options.cases}};
  return suites_named(options.suite);
}

std::vector<RunPlan> plan_runs(const std::vector<Suite>& suites, const CliOptions& options,
                               const std::vector<std::string>& impls,
                               const std::function<bool(const std::string& impl, Mode mode)>& supports) {
  std::vector<RunPlan> plans;
  for (const Suite& suite : suites)
    for (DType dtype : options.dtypes)
      for (Mode mode : options.modes)
        for (const std::string& impl : impls)
          if (supports(impl, mode)) plans.push_back({{suite.name, mode, dtype, impl}, suite.shapes});
  return plans;
}

void run_plans(const std::vector<RunPlan>& plans, Mask mask, const CaseFn& run_case, Report* report) {
  int total = 0;
  for (const RunPlan& plan : plans) total += int(plan.shapes.size());
  Progress progress(total);
  for (const RunPlan& plan : plans) {
    RunResult run{plan, {}};
    for (const Shape& shape : plan.shapes) {
      progress.start_case(run, shape);
      const CaseSpec spec{shape, plan.dtype, mask, plan.mode};
      run.cases.push_back(run_case(plan, spec, [&](const char* stage) { progress.stage(stage); }));
    }
    progress.clear();
    print_run(run);
    report->runs.push_back(std::move(run));
  }
}

}  // namespace qkbench
