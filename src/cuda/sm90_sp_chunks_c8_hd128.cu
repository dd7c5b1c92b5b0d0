// The Hopper pingpong single pass's chunk schedule in clusters of 8 CTAs (causal rows of up to 1024 keys) for
// bf16 and fp16, head dimension 128: in an A/B build that defines QKSOFTMAX_SM90_SP_CHUNKS only (dispatch.cu).
#ifdef QKSOFTMAX_SM90_SP_CHUNKS
#include "cuda/sm90/sp_launch.cuh"
#include "cuda/sm90_instances.h"

namespace qksoftmax::cuda {
template Status run_sm90_single_pass<sm90::SpPpConfig<cutlass::bfloat16_t, 128, true, 8, true>>(const Problem&,
                                                                                                CUstream_st*, bool);
template Status run_sm90_single_pass<sm90::SpPpConfig<cutlass::half_t, 128, true, 8, true>>(const Problem&,
                                                                                             CUstream_st*, bool);
}  // namespace qksoftmax::cuda
#endif
