// The pingpong single pass (src/cuda/sm90/sp_pp_config.h) instantiated for the kernel tests
// (test_sm90_sp_variants.cpp), behind a plain function: the library's CUDA code builds as C++17, the tests as C++20.
#include "cuda/sm90/sp_launch.cuh"
#include "sp_variants.h"

namespace qksoftmax::test {

Status run_single_pass(const Problem& prob, CUstream_st* stream) {
  return cuda::run_sm90_single_pass<cuda::sm90::SpPpConfig<cutlass::bfloat16_t, 128>>(prob, stream);
}

}  // namespace qksoftmax::test
