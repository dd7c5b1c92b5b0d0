// The CUDA backend of a library built without the CUDA toolkit: every call on Device::kCUDA is refused with a
// Status that says why, and nothing is written. The CPU backend is the same as in a CUDA build.
#include "cuda/cuda_backend.h"

namespace qksoftmax::cuda {

Status locate(Problem*) {
  return {Code::kUnsupported,
          "q: qksoftmax was built without CUDA, so Device::kCUDA is not available (Device::kCPU is; rebuild "
          "with the CUDA toolkit for the GPU backend)"};
}

DeviceScope::~DeviceScope() = default;

Status DeviceScope::enter(int) { return locate(nullptr); }

size_t workspace_size(const Problem&) { return 0; }
size_t plan_workspace_size(const Problem&) { return 0; }

Status run(const Problem&, void*, CUstream_st*) { return locate(nullptr); }

}  // namespace qksoftmax::cuda
