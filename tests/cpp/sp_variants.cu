// The key-block single pass's two forms (src/cuda/sm90/sp_config.h, kKResident) instantiated for the kernel
// tests (test_sm90_sp_variants.cpp), behind a plain function: the library's CUDA code builds as C++17, the tests
// as C++20.
#include "cuda/sm90/sp_launch.cuh"
#include "sp_variants.h"

namespace qksoftmax::test {

Status run_sp_variant(const Problem& prob, bool k_resident, CUstream_st* stream) {
  using cuda::sm90::SpConfig;
  return k_resident ? cuda::run_sm90_single_pass<SpConfig<cutlass::bfloat16_t, 128, true>>(prob, stream)
                    : cuda::run_sm90_single_pass<SpConfig<cutlass::bfloat16_t, 128, false>>(prob, stream);
}

}  // namespace qksoftmax::test
