#include "gpu_runner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "check.h"
#include "cuda_check.h"
#include "dtype.h"
#include "gpu.h"
#include "gpu_check.h"
#include "timing.h"

namespace qkbench {
namespace {

// Input rotation. Call n works on set n mod k. A byte of set c is read again k calls later, after the
// k − 1 calls in between have moved (k − 1) · bytes-per-call of other data through the L2. docs/SPEC.md
// asks that each timed call read data it did not just touch, with ≥ 3× L2 of traffic in between, so
//     k = 1 + ceil(3 · L2 / bytes-per-call), at least 2 (never the set the previous call used),
// with bytes-per-call the SOL model's bytes (the minimum any implementation moves). Large cases (one call
// already moves ≥ 3× L2) get k = 2. If k sets do not fit in device memory and one call moves ≥ 3× L2,
// k = 1 is still sound: calls stream their tensors in the same order, so between two reads of a byte a
// whole call (≥ 3× L2) of other traffic passes. Otherwise the case is not run. Tiny cases are capped at
// kMaxCopies sets (reported per case in the JSON as "copies").
constexpr double kL2Multiple = 3;
constexpr int kMinCopies = 2;
constexpr int kMaxCopies = 1024;
constexpr size_t kMemoryReserve = size_t(2) << 30;  // for cuBLAS, the library's workspace, fragmentation
constexpr uint64_t kSeedSalt = 0x5eed0000;
constexpr int kSetSeedShift = 16;
constexpr double kGiB = double(size_t(1) << 30);

std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GiB", bytes / kGiB);
  return buf;
}

Result plan_copies(const GpuContext& ctx, double per_call_bytes, size_t one_set, size_t shared, int* copies) {
  const double needed_traffic = kL2Multiple * double(ctx.l2_bytes);
  const int wanted = std::clamp(1 + int(std::ceil(needed_traffic / per_call_bytes)), kMinCopies, kMaxCopies);
  size_t free = 0;
  QKB_TRY(free_device_bytes(&free));
  const size_t usable = free > kMemoryReserve ? free - kMemoryReserve : 0;
  auto fits = [&](int k) { return size_t(k) * one_set + shared <= usable; };
  if (fits(wanted)) {
    *copies = wanted;
    return {};
  }
  if (per_call_bytes >= needed_traffic && fits(1)) {
    *copies = 1;
    return {};
  }
  return Result("does not fit in device memory: " + std::to_string(wanted) + " sets of " + gib(double(one_set)) +
                " + " + gib(double(shared)) + " shared, " + gib(double(usable)) + " usable");
}

uint64_t seed_for(int set, Role role) { return kSeedSalt ^ (uint64_t(set) << kSetSeedShift) ^ uint64_t(role); }

// Everything one case holds on the device.
struct Workload {
  std::vector<DeviceBuffer> memory;  // one per set
  std::vector<TensorSet> sets;
  DeviceBuffer workspace;

  Workspace scratch() const { return {workspace.get(), workspace.bytes()}; }
};

// Workspace for the mode's call and, where saved inputs are made, for the forward that makes them.
Result allocate_workspace(const Impl& impl, const CaseSpec& spec, const TensorSet& set, void* p_scratch,
                          DeviceBuffer* workspace) {
  size_t bytes = 0;
  QKB_TRY(impl.workspace_bytes(spec, set, &bytes));
  if (!saved_roles(spec.mode).empty()) {
    size_t forward_bytes = 0;
    QKB_TRY(impl.workspace_bytes(as_forward(spec), forward_set(set, p_scratch), &forward_bytes));
    bytes = std::max(bytes, forward_bytes);
  }
  return workspace->allocate(bytes);
}

// Draws the random inputs of every set and runs the implementation's forward for the saved ones.
Result make_inputs(const GpuContext& ctx, Impl& impl, const CaseSpec& spec, Workload* w) {
  DeviceBuffer p_scratch;
  QKB_TRY(p_scratch.allocate(p_scratch_bytes(spec)));
  QKB_TRY(allocate_workspace(impl, spec, w->sets[0], p_scratch.get(), &w->workspace));
  for (size_t i = 0; i < w->sets.size(); ++i) {
    const TensorSet& set = w->sets[i];
    for (Role r : random_roles(spec.mode))
      QKB_TRY(fill_normal(set[r], spec.dtype, role_elements(r, spec.shape), seed_for(int(i), r), ctx.stream));
    if (!saved_roles(spec.mode).empty())
      QKB_TRY(impl.call(as_forward(spec), forward_set(set, p_scratch.get()), w->scratch(), ctx.stream));
  }
  QKB_CUDA(cudaStreamSynchronize(ctx.stream));
  return launch_result("making the inputs");
}

Result allocate_sets(const CaseSpec& spec, int copies, Workload* w) {
  const size_t bytes = set_bytes(spec);
  w->memory.resize(size_t(copies));
  for (DeviceBuffer& m : w->memory) {
    QKB_TRY(m.allocate(bytes));
    w->sets.push_back(carve_set(spec, m.get()));
  }
  return {};
}

// Poisons the outputs of set 0 (0xFF bytes: NaN in every dtype), calls, optionally perturbs the outputs,
// and compares the last head with the CPU backend.
Result checked_call(const GpuContext& ctx, Impl& impl, const CaseSpec& spec, Workload& w,
                    std::vector<OutputError>* errors) {
  const TensorSet& set = w.sets[0];
  for (Role r : output_roles(spec.mode))
    QKB_CUDA(cudaMemsetAsync(set[r], kPoisonByte, role_bytes(r, spec), ctx.stream));
  QKB_TRY(impl.call(spec, set, w.scratch(), ctx.stream));
  if (ctx.inject_error)
    for (Role r : output_roles(spec.mode))
      QKB_TRY(scale_in_place(set[r], role_dtype(r, spec.dtype), role_elements(r, spec.shape), 1 + kInjectedError,
                             ctx.stream));
  QKB_CUDA(cudaStreamSynchronize(ctx.stream));
  QKB_TRY(launch_result(impl.name()));
  return check_last_head(spec, set, errors);
}

Result run_case(const GpuContext& ctx, Impl& impl, const CaseSpec& spec, const StageFn& stage, CaseResult* out) {
  stage("allocating");
  const size_t shared = p_scratch_bytes(spec) + impl.planned_workspace_bytes(spec);
  QKB_TRY(plan_copies(ctx, out->cost.bytes, set_bytes(spec), shared, &out->copies));
  Workload w;
  QKB_TRY(allocate_sets(spec, out->copies, &w));
  stage("making inputs");
  QKB_TRY(make_inputs(ctx, impl, spec, &w));
  stage("checking against the CPU backend");
  QKB_TRY(checked_call(ctx, impl, spec, w, &out->errors));
  out->failure = verdict(out->errors, spec.dtype);
  if (!out->passed() && !ctx.time_failed) return {};
  stage("timing");
  double us = 0, host_us = 0;
  QKB_TRY(median_call_us(ctx.stream, {ctx.warmup, ctx.runs, out->copies}, [&](int i) {
    return impl.call(spec, w.sets[size_t(i)], w.scratch(), ctx.stream);
  }, &us, &host_us));
  QKB_TRY(launch_result(impl.name()));
  out->us = us;
  out->host_us = host_us;
  return {};
}

}  // namespace

CaseResult run_gpu_case(const GpuContext& ctx, Impl& impl, const CaseSpec& spec, const StageFn& stage) {
  CaseResult result;
  result.shape = spec.shape;
  result.cost = sol_cost(spec.shape, spec.mode, spec.dtype, spec.mask);
  result.sol_us = sol_us(result.cost, spec.dtype, ctx.ceilings);
  if (Result r = run_case(ctx, impl, spec, stage, &result); !r.ok()) {
    result.us.reset();
    result.failure = "error: " + r.message();
    cudaStreamSynchronize(ctx.stream);  // let nothing of a failed case run on into the next
    cudaGetLastError();
  }
  return result;
}

}  // namespace qkbench
