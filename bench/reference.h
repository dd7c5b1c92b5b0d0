// A direct fp64 computation of CONTRACT.md section 1 on host data, independent of qksoftmax: the reference
// of the CPU fallback (which checks the CPU backend itself).
#pragma once

#include <array>
#include <vector>

#include "tensors.h"

namespace qkbench {

using HostTensors = std::array<std::vector<double>, kRoleCount>;

// From the inputs of spec.mode (every head; P read for saved_p, LSE never: it is recomputed), fills the
// outputs of spec.mode: forward P (dense, 0 where masked) and LSE; backward dQ and dK. Scale 1/√D.
void reference(const CaseSpec& spec, const HostTensors& in, HostTensors* out);

}  // namespace qkbench
