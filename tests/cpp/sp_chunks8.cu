// The chunk schedule of the pingpong single pass in clusters of 8 CTAs for the kernel tests (sp_variants.h), one
// translation unit per cluster size so that they compile in parallel.
#include "cuda/sm90/sp_launch.cuh"
#include "sp_variants.h"

namespace qksoftmax::test {

Status run_single_pass_chunks8(const Problem& prob, CUstream_st* stream) {
  return cuda::run_sm90_single_pass<cuda::sm90::SpPpConfig<cutlass::bfloat16_t, 128, true, 8, true>>(prob, stream);
}

}  // namespace qksoftmax::test
