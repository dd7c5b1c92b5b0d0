// The pingpong single pass for the kernel tests (sp_variants.cu): bf16, D = 128, recompute, through its internal
// entry point.
#pragma once

#include "problem.h"

struct CUstream_st;

namespace qksoftmax::test {

Status run_single_pass(const Problem& prob, CUstream_st* stream);

}  // namespace qksoftmax::test
