// The Hopper pingpong single pass (recompute) for bf16, head dimension 128:
// in one CTA (rows of up to 128 keys).
#include "cuda/sm90/sp_launch.cuh"
#include "cuda/sm90_instances.h"

namespace qksoftmax::cuda {
template Status run_sm90_single_pass<sm90::SpPpConfig<cutlass::bfloat16_t, 128, true, 1>>(const Problem&, CUstream_st*, bool);
template int sm90_single_pass_resident_clusters<sm90::SpPpConfig<cutlass::bfloat16_t, 128, true, 1>>();
}  // namespace qksoftmax::cuda
