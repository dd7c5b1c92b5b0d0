// The Hopper pingpong single pass (saved-P) for bf16, head dimension 128:
// in one CTA (rows of up to 128 keys).
#include "cuda/sm90/sp_launch.cuh"
#include "cuda/sm90_instances.h"

namespace qksoftmax::cuda {
using SavedP = sm90::SpPpConfig<cutlass::bfloat16_t, 128, true, 1, true>;
template Status run_sm90_single_pass<SavedP>(const Problem&, CUstream_st*, bool);
template int sm90_single_pass_resident_clusters<SavedP>();
}  // namespace qksoftmax::cuda
