// The generic kernels for fp16, head dimension 128.
#include "cuda/generic_instances.h"
#include "cuda/generic_launch.cuh"

namespace qksoftmax::cuda {
template Status run_generic<GenericConfig<cutlass::half_t, 128>>(const Problem&, void*, CUstream_st*);
}  // namespace qksoftmax::cuda
