// The Hopper single-pass backward for bfloat16, head dimension 128, saved-P mode.
#include "cuda/sm90/bwd_launch.cuh"
#include "cuda/sm90_instances.h"

namespace qksoftmax::cuda {
template Status run_sm90_bwd<sm90::BwdConfig<cutlass::bfloat16_t, 128, true>>(const Problem&, CUstream_st*, int64_t);
template int sm90_bwd_resident_clusters<sm90::BwdConfig<cutlass::bfloat16_t, 128, true>>(int);
}  // namespace qksoftmax::cuda
