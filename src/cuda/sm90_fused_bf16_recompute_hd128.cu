// The Hopper fused backward for bfloat16, head dimension 128, recompute mode.
#include "cuda/sm90_fused_launch.cuh"
#include "cuda/sm90_instances.h"

namespace qksoftmax::cuda {
template Status run_sm90_fused<sm90::FusedConfig<cutlass::bfloat16_t, 128, false>>(const Problem&, CUstream_st*);
}  // namespace qksoftmax::cuda
