// Argument validation: turns the public call's arguments into a Problem, or says what is wrong.
#pragma once

#include "problem.h"
#include "qksoftmax/qksoftmax.h"

namespace qksoftmax {

// Checks every argument and option of a call (shapes, ranks, dtypes, devices, strides, aliasing, options)
// without touching tensor memory. On success fills *problem; on error returns kInvalidArgument (kUnsupported
// for valid float64 tensors on the CUDA device) with a message that starts with the argument's name
// ("dk: expected ...") and leaves *problem unchanged.
Status make_problem(const ForwardArgs& args, const Options& options, Problem* problem);
Status make_problem(const BackwardArgs& args, const Options& options, Problem* problem);

}  // namespace qksoftmax
