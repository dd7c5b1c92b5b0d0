// The correctness check of a GPU call against the fp64 CPU backend, on one (b, h) slice.
#pragma once

#include <vector>

#include "result.h"
#include "results.h"
#include "tensors.h"

namespace qkbench {

// Copies head (b, h) = (B−1, H−1) of a device set (after its call has completed) to the host, runs the CPU
// backend of qksoftmax (fp64 inside) on fp32 copies of that head's inputs alone (B = H = 1: heads are
// independent), and gives the relative Frobenius error of each output of the mode.
Result check_last_head(const CaseSpec& spec, const TensorSet& device_set, std::vector<OutputError>* errors);

}  // namespace qkbench
