#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "check.h"
#include "driver.h"
#include "dtype.h"
#include "host_buffer.h"
#include "paths.h"
#include "reference.h"
#include "results.h"

namespace qkbench {
namespace {

constexpr Shape kSmallCase{1, 2, 128, 64};
constexpr const char* kImplCpu = "qksoftmax_cpu";
constexpr const char* kSuiteCpu = "cpu";
constexpr uint64_t kSeed = 0x5eed;
constexpr double kMicrosecondsPerSecond = 1e6;

void fill_normal_host(void* data, DType dtype, int64_t n, std::mt19937_64& rng) {
  std::normal_distribution<float> normal;
  for (int64_t i = 0; i < n; ++i) qksoftmax::store_from_float(data, i, dtype, normal(rng));
}

void scale_host(void* data, DType dtype, int64_t n, float factor) {
  for (int64_t i = 0; i < n; ++i)
    qksoftmax::store_from_float(data, i, dtype, qksoftmax::load_as_float(data, i, dtype) * factor);
}

std::vector<double> to_doubles(const void* data, DType dtype, int64_t n) {
  std::vector<double> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[size_t(i)] = qksoftmax::load_as_float(data, i, dtype);
  return out;
}

using HostTensors = std::array<std::vector<double>, kRoleCount>;

// The outputs of spec.mode by the fp64 reference (tests/common/reference.h), from the inputs of spec.mode:
// forward P (dense, 0 where masked) and LSE; backward dQ and dK, P read in saved_p mode and recomputed
// otherwise (a given LSE is not used). Scale 1/√D.
void reference_outputs(const CaseSpec& spec, const HostTensors& in, HostTensors* out) {
  namespace reference = qksoftmax::reference;
  const Shape& s = spec.shape;
  const reference::Dims dims{s.B, s.H, s.H, s.S, s.S, s.D, spec.mask == Mask::kCausal, 1 / std::sqrt(double(s.D))};
  const auto input = [&](Role r) -> const std::vector<double>& { return in[size_t(r)]; };
  const auto output = [&](Role r) -> std::vector<double>& { return (*out)[size_t(r)]; };
  if (!is_backward(spec.mode)) {
    reference::Forward fwd = reference::forward(dims, input(Role::kQ), input(Role::kK));
    output(Role::kP) = std::move(fwd.p);
    output(Role::kLse) = std::move(fwd.lse);
    return;
  }
  const std::vector<double>* saved_p = reads_saved_p(spec.mode) ? &input(Role::kP) : nullptr;
  reference::Gradients grads =
      reference::backward(dims, input(Role::kQ), input(Role::kK), input(Role::kDp), saved_p, nullptr);
  output(Role::kDq) = std::move(grads.dq);
  output(Role::kDk) = std::move(grads.dk);
}

Result call_cpu(const CaseSpec& spec, const TensorSet& set) {
  size_t bytes = 0;
  QKB_TRY(library_result(library_workspace_bytes(spec, set, qksoftmax::Device::kCPU, &bytes), "workspace size"));
  HostBuffer workspace(bytes);
  return library_result(library_call(spec, set, qksoftmax::Device::kCPU, workspace.get(), bytes, nullptr),
                        "qksoftmax (CPU backend)");
}

// Random Q, K, dP; P or LSE from the CPU backend's forward.
Result make_inputs(const CaseSpec& spec, const TensorSet& set) {
  std::mt19937_64 rng(kSeed);
  for (Role r : random_roles(spec.mode)) fill_normal_host(set[r], spec.dtype, role_elements(r, spec.shape), rng);
  if (saved_roles(spec.mode).empty()) return {};
  HostBuffer p_scratch(p_scratch_bytes(spec));
  return call_cpu(as_forward(spec), forward_set(set, p_scratch.get()));
}

// Poisons the outputs, calls, optionally perturbs, and compares everything with the fp64 reference.
Result checked_call(const CliOptions& options, const CaseSpec& spec, const TensorSet& set,
                    std::vector<OutputError>* errors) {
  for (Role r : output_roles(spec.mode))
    std::memset(set[r], kPoisonByte, role_bytes(r, spec));
  QKB_TRY(call_cpu(spec, set));
  if (options.inject_error)
    for (Role r : output_roles(spec.mode))
      scale_host(set[r], role_dtype(r, spec.dtype), role_elements(r, spec.shape), 1 + kInjectedError);
  HostTensors in, ref;
  for (Role r : input_roles(spec.mode))
    in[size_t(r)] = to_doubles(set[r], role_dtype(r, spec.dtype), role_elements(r, spec.shape));
  reference_outputs(spec, in, &ref);
  errors->clear();
  for (Role r : output_roles(spec.mode))
    errors->push_back({role_name(r), relative_error(set[r], role_dtype(r, spec.dtype), ref[size_t(r)].data(),
                                                    role_elements(r, spec.shape))});
  return {};
}

Result time_cpu(const CliOptions& options, const CaseSpec& spec, const TensorSet& set, double* us) {
  std::vector<double> times;
  for (int i = 0; i < options.warmup + options.runs; ++i) {
    const auto start = std::chrono::steady_clock::now();
    QKB_TRY(call_cpu(spec, set));
    const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
    if (i >= options.warmup) times.push_back(elapsed.count() * kMicrosecondsPerSecond);
  }
  *us = median(std::move(times));
  return {};
}

Result run_case(const CliOptions& options, const CaseSpec& spec, const StageFn& stage, CaseResult* out) {
  HostBuffer memory(set_bytes(spec));
  const TensorSet set = carve_set(spec, memory.get());
  stage("making inputs");
  QKB_TRY(make_inputs(spec, set));
  stage("checking against the fp64 reference");
  QKB_TRY(checked_call(options, spec, set, &out->errors));
  out->failure = verdict(out->errors, spec.dtype);
  if (!out->passed() && !options.time_failed) return {};
  stage("timing");
  double us = 0;
  QKB_TRY(time_cpu(options, spec, set, &us));
  out->us = us;
  return {};
}

CaseResult run_cpu_case(const CliOptions& options, const CaseSpec& spec, const StageFn& stage) {
  CaseResult result;
  result.shape = spec.shape;
  result.cost = sol_cost(spec.shape, spec.mode, spec.dtype, spec.mask);
  result.copies = 1;
  if (Result r = run_case(options, spec, stage, &result); !r.ok()) {
    result.us.reset();
    result.failure = "error: " + r.message();
  }
  return result;
}

}  // namespace

Result run_cpu(const CliOptions& options, Report* report) {
  if (options.suite_given && options.cases.empty()) {
    return Result("--suite " + options.suite + ": the suites run on a CUDA GPU; the CPU backend runs a small case "
                  "(no --suite) or the --case shapes");
  }
  report->env.gpu = "none (CPU backend)";
  const std::vector<Suite> suites =
      options.cases.empty() ? std::vector<Suite>{{kSuiteCpu, {kSmallCase}}} : selected_suites(options);
  const std::vector<RunPlan> plans = plan_runs(suites, options, {kImplCpu}, [](const std::string&, Mode) { return true; });
  run_plans(plans, options.mask, [&](const RunPlan&, const CaseSpec& spec, const StageFn& stage) {
    return run_cpu_case(options, spec, stage);
  }, report);
  return {};
}

}  // namespace qkbench
