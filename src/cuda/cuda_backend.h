// The CUDA backend: kernels for a validated Problem, launched asynchronously on a stream.
#pragma once

#include <cstddef>

#include "problem.h"

namespace qksoftmax::cuda {

// Checks what only the CUDA runtime can tell: every present pointer of the problem is device memory
// of the current device. Never synchronises.
Status check_pointers(const Problem& problem);

// Workspace bytes the problem needs (a multiple of kWorkspaceAlignment; 0 when none).
size_t workspace_size(const Problem& problem);

// Runs the problem. Returns kUnsupported (having launched nothing) for a head dimension or dtype that
// no kernel covers; kCudaError if a launch fails.
Status run(const Problem& problem, void* workspace, CUstream_st* stream);

}  // namespace qksoftmax::cuda
