// The generic kernels for fp32, head dimension 64.
#include "cuda/generic_instances.h"
#include "cuda/generic_launch.cuh"

namespace qksoftmax::cuda {
template Status run_generic<GenericConfig<float, 64>>(const Problem&, void*, CUstream_st*);
}  // namespace qksoftmax::cuda
