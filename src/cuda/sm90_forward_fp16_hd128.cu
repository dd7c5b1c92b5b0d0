// The Hopper fused forward for float16, head dimension 128.
#include "cuda/sm90_forward_launch.cuh"
#include "cuda/sm90_instances.h"

namespace qksoftmax::cuda {
template Status run_sm90_forward<sm90::ForwardConfig<cutlass::half_t, 128>>(const Problem&, CUstream_st*);
}  // namespace qksoftmax::cuda
