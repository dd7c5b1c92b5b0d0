// The generic kernels for bf16, head dimension 64.
#include "cuda/generic_instances.h"
#include "cuda/generic_launch.cuh"

namespace qksoftmax::cuda {
template Status run_generic<GenericConfig<cutlass::bfloat16_t, 64>>(const Problem&, void*, CUstream_st*);
}  // namespace qksoftmax::cuda
