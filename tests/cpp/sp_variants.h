// The single pass's forms for the kernel tests (sp_variants.cu): bf16, D = 128, recompute.
#pragma once

#include "problem.h"

struct CUstream_st;

namespace qksoftmax::test {

// The dispatched form (the consumers own the dQ products in turns) or the one with a dQ warpgroup
// (sm90_instances.h's SpConfig kDqWarpgroup).
enum class SpForm { kDispatched, kDqWarpgroup };
Status run_sp_variant(const Problem& prob, SpForm form, CUstream_st* stream);

}  // namespace qksoftmax::test
