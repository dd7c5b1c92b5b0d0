// Placeholder until the kernels land: reports every problem as unsupported.
#include <cuda_runtime.h>

#include "cuda/cuda_backend.h"

namespace qksoftmax::cuda {

Status check_pointers(const Problem&) { return {}; }
size_t workspace_size(const Problem&) { return 0; }
Status run(const Problem&, void*, CUstream_st*) {
  return {Code::kUnsupported, "the CUDA backend is not built yet"};
}

}  // namespace qksoftmax::cuda
