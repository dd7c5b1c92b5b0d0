// The CUDA backend of a library built without the CUDA toolkit: every call on Device::kCUDA is refused with a
// Status that says why, and nothing is written. The CPU backend is the same as in a CUDA build.
#include "cuda/cuda_backend.h"

namespace qksoftmax::cuda {

Status check_pointers(const Problem&) {
  return {Code::kUnsupported,
          "q: qksoftmax was built without CUDA, so Device::kCUDA is not available (Device::kCPU is; rebuild "
          "with the CUDA toolkit for the GPU backend)"};
}

size_t workspace_size(const Problem&) { return 0; }

Status run(const Problem& problem, void*, CUstream_st*) { return check_pointers(problem); }

}  // namespace qksoftmax::cuda
