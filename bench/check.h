// Host-side checking: conversions, relative Frobenius errors and the verdict against the accuracy bar
// (tests/common/accuracy.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model.h"
#include "results.h"

namespace qkbench {

// The checked call's outputs are first filled with this byte: 0xFF…FF is a NaN in every dtype.
inline constexpr int kPoisonByte = 0xFF;
// --inject-error multiplies the checked call's outputs by 1 + this: a 5% error fails every dtype's bound.
inline constexpr float kInjectedError = 0.05f;

// Runs body(begin, end) over [0, n) split across the host's cores.
void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& body);

// Elements of a host buffer of dtype as float.
std::vector<float> to_floats(const void* data, DType dtype, int64_t n);

// ‖out − ref‖ / ‖ref‖ in fp64 over n elements; out has the given dtype. NaN when out holds a NaN.
double relative_error(const void* out, DType dtype, const float* ref, int64_t n);
double relative_error(const void* out, DType dtype, const double* ref, int64_t n);

// Empty when every error is within the bound of dtype; otherwise "FAILED: dQ 5.0e-02 > 1.0e-02, ...".
// NaN never passes.
std::string verdict(const std::vector<OutputError>& errors, DType dtype);

}  // namespace qkbench
