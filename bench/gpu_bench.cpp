#include <cstdio>
#include <map>

#include "baseline.h"
#include "ceilings.h"
#include "driver.h"
#include "gpu.h"
#include "gpu_runner.h"
#include "paths.h"
#include "report.h"

namespace qkbench {

Result run_gpu(const CliOptions& options, Report* report) {
  DeviceInfo info;
  QKB_TRY(device_info(&info));
  Stream stream;
  QKB_TRY(create_stream(&stream));
  Cublas cublas;
  QKB_TRY(create_cublas(stream.get(), &cublas));

  report->env.gpu = info.name;
  report->env.l2_bytes = info.l2_bytes;
  report->env.sms = info.sms;
  report->env.cuda_runtime = info.cuda_runtime;
  std::printf("GPU: %s, %d SMs, L2 %.0f MiB, CUDA runtime %s\n", info.name.c_str(), info.sms,
              double(info.l2_bytes) / double(1 << 20), info.cuda_runtime.c_str());
  std::fflush(stdout);

  std::fprintf(stderr, "measuring the ceilings ...\n");
  GpuContext ctx{stream.get(), info.l2_bytes, {}, options.warmup, options.runs, options.inject_error,
                 options.time_failed};
  QKB_TRY(measure_ceilings(stream.get(), cublas.get(), &ctx.ceilings));
  report->env.ceilings = ctx.ceilings;
  print_ceilings(ctx.ceilings);

  std::map<std::string, std::unique_ptr<Impl>> impls;
  impls[kImplQkSoftmax] = make_qksoftmax_impl(false);
  impls[kImplQkSoftmaxDeterministic] = make_qksoftmax_impl(true);
  impls[kImplCublasUnfused] = make_cublas_unfused_impl(cublas.get());
  const std::vector<RunPlan> plans =
      plan_runs(selected_suites(options), options, options.impls,
                [&](const std::string& impl, Mode mode) { return impls.at(impl)->supports(mode); });
  run_plans(plans, options.mask, [&](const RunPlan& run, const CaseSpec& spec, const StageFn& stage) {
    return run_gpu_case(ctx, *impls.at(run.impl), spec, stage);
  }, report);
  return {};
}

}  // namespace qkbench
