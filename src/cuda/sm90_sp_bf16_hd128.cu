// The Hopper pingpong single pass (rows of up to 128 keys, recompute) for bf16, head dimension 128.
#include "cuda/sm90/sp_launch.cuh"
#include "cuda/sm90_instances.h"

namespace qksoftmax::cuda {
template Status run_sm90_single_pass<sm90::SpPpConfig<cutlass::bfloat16_t, 128>>(const Problem&, CUstream_st*, bool);
}  // namespace qksoftmax::cuda
