// One case of one implementation on the GPU: plan memory, make inputs, check, then time.
#pragma once

#include <cuda_runtime.h>

#include "impl.h"
#include "results.h"

namespace qkbench {

struct GpuContext {
  cudaStream_t stream = nullptr;
  int64_t l2_bytes = 0;
  Ceilings ceilings;
  int warmup = 0;
  int runs = 0;
  bool inject_error = false;
  bool time_failed = false;
};

CaseResult run_gpu_case(const GpuContext& ctx, Impl& impl, const CaseSpec& spec, const StageFn& stage);

}  // namespace qkbench
