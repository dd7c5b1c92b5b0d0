// The key-block single pass's step forms for the kernel tests (sp_variants.cu): bf16, D = 128, recompute.
#pragma once

#include "problem.h"

struct CUstream_st;

namespace qksoftmax::test {

// sm90_instances.h's SpStep, mirrored here (the tests do not include the CUDA headers): K_w resident in
// registers; from shared memory with the dQ product in flight; that with Sᵀ(t + 1) issued at the step's top; and
// that schedule with S's rows on the products' M.
enum class SpForm { kResident, kShared, kEarlyS, kRows };
Status run_sp_variant(const Problem& prob, SpForm form, CUstream_st* stream);

}  // namespace qksoftmax::test
