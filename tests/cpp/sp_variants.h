// The pingpong single pass for the kernel tests (sp_variants.cu): D = 128, through its internal entry point, as
// dispatched (with a dK warpgroup: the library's instances, bf16 or fp16, recompute or saved-P by prob's mode) or
// with dK held by the consumers (SpPpConfig kDkWarpgroup = false; bf16 recompute, an error otherwise).
#pragma once

#include "problem.h"

struct CUstream_st;

namespace qksoftmax::test {

enum class SpForm { kDispatched, kThreeWarpgroups };
Status run_single_pass(const Problem& prob, SpForm form, CUstream_st* stream);

// The pingpong single pass in a cluster of `cluster` CTAs (1, 2, 4 or 8; rows of more than 128·(cluster / 2) and
// up to 128·cluster keys), bf16 or fp16, D = 128, recompute or saved-P: the library's instances, called directly.
Status run_single_pass_cluster(const Problem& prob, int cluster, CUstream_st* stream);

}  // namespace qksoftmax::test
