// The key-block single pass's step forms (src/cuda/sm90/sp_config.h, SpStep) instantiated for the kernel
// tests (test_sm90_sp_variants.cpp), behind a plain function: the library's CUDA code builds as C++17, the tests
// as C++20.
#include "cuda/sm90/sp_launch.cuh"
#include "sp_variants.h"

namespace qksoftmax::test {

Status run_sp_variant(const Problem& prob, SpForm form, CUstream_st* stream) {
  using cuda::sm90::SpConfig;
  using cuda::sm90::SpStep;
  switch (form) {
    case SpForm::kResident:
      return cuda::run_sm90_single_pass<SpConfig<cutlass::bfloat16_t, 128, SpStep::kResident>>(prob, stream);
    case SpForm::kShared:
      return cuda::run_sm90_single_pass<SpConfig<cutlass::bfloat16_t, 128, SpStep::kShared>>(prob, stream);
    case SpForm::kEarlyS:
      return cuda::run_sm90_single_pass<SpConfig<cutlass::bfloat16_t, 128, SpStep::kEarlyS>>(prob, stream);
    case SpForm::kRows:
      return cuda::run_sm90_single_pass<SpConfig<cutlass::bfloat16_t, 128, SpStep::kRows>>(prob, stream);
  }
  return {Code::kInternal, "unknown single-pass form"};
}

}  // namespace qksoftmax::test
