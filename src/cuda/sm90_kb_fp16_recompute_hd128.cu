// The Hopper key-block pass (two-pass backward) for float16, head dimension 128, recompute mode,
// dQ added directly and into the accumulator.
#include "cuda/sm90/kb_launch.cuh"
#include "cuda/sm90_instances.h"

namespace qksoftmax::cuda {
template Status run_sm90_keyblock<sm90::KbConfig<cutlass::half_t, 128, false, true>>(
    const Problem&, const generic::Params&, const sm90::DqTarget&, int*, CUstream_st*);
template Status run_sm90_keyblock<sm90::KbConfig<cutlass::half_t, 128, false, false>>(
    const Problem&, const generic::Params&, const sm90::DqTarget&, int*, CUstream_st*);
}  // namespace qksoftmax::cuda
