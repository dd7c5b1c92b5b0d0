// The accuracy bar (docs/SPEC.md, "Accuracy"): the largest relative Frobenius error ‖out − ref‖ / ‖ref‖ against
// an fp64 reference that an output of each dtype may have; NaN never passes. bfloat16, float16 and float32 are
// the bar of every backend; float64 (the CPU backend only) is computed in fp64 throughout.
//
// The one table of the C++ tests and the bench; tests/python/qk_reference.py and bench/torch_peers.py read it
// from this file, one {DType, "name", bound} entry per line.
#pragma once

#include "qksoftmax/qksoftmax.h"

namespace qksoftmax::accuracy {

struct Bound {
  DType dtype;
  const char* name;
  double max_rel_error;
};

inline constexpr Bound kBounds[] = {
    {DType::kBFloat16, "bfloat16", 1e-2},
    {DType::kFloat16, "float16", 2e-3},
    {DType::kFloat32, "float32", 1e-5},
    {DType::kFloat64, "float64", 1e-12},
};

// The bound of dtype t (0 for a value outside the enum: nothing passes).
constexpr double bound(DType t) {
  for (const Bound& b : kBounds) {
    if (b.dtype == t) return b.max_rel_error;
  }
  return 0;
}

}  // namespace qksoftmax::accuracy
