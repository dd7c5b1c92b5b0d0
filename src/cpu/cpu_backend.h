// The CPU backend: a straightforward fp64 implementation on host memory, using every core.
#pragma once

#include "problem.h"

namespace qksoftmax::cpu {

// Runs the problem synchronously. Any strides; masked positions of p and dp are never read.
Status run(const Problem& problem);

}  // namespace qksoftmax::cpu
