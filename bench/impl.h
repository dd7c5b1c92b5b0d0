// An implementation under test: qksoftmax itself (fast or deterministic), or the unfused cuBLAS baseline.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <memory>

#include "result.h"
#include "tensors.h"

namespace qkbench {

struct Workspace {
  void* data = nullptr;
  size_t bytes = 0;
};

class Impl {
 public:
  virtual ~Impl() = default;

  virtual const char* name() const = 0;
  virtual bool supports(Mode mode) const = 0;
  // Device scratch a call needs, as far as it is known before any tensor exists (to plan memory).
  virtual size_t planned_workspace_bytes(const CaseSpec& spec) const = 0;
  // The exact scratch call(spec, set, ...) needs.
  virtual Result workspace_bytes(const CaseSpec& spec, const TensorSet& set, size_t* bytes) const = 0;
  // Enqueues the call of spec.mode on stream (kForward: Q, K → P and LSE where the set has it); never
  // synchronises.
  virtual Result call(const CaseSpec& spec, const TensorSet& set, Workspace workspace, cudaStream_t stream) = 0;
};

// deterministic: Options::deterministic (bitwise-reproducible results), reported as its own impl.
std::unique_ptr<Impl> make_qksoftmax_impl(bool deterministic);

}  // namespace qkbench
