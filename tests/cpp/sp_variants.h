// The key-block single pass's two forms for the kernel tests (sp_variants.cu): bf16, D = 128, recompute.
#pragma once

#include "problem.h"

struct CUstream_st;

namespace qksoftmax::test {

// K_w resident in registers (as dispatched) or read from shared memory with the dQ product in flight.
Status run_sp_variant(const Problem& prob, bool k_resident, CUstream_st* stream);

}  // namespace qksoftmax::test
