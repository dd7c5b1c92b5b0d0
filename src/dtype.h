// Host-side element conversions for the storage dtypes (round to nearest even), shared by the CPU backend,
// the tests and the bench.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "problem.h"

namespace qksoftmax {

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::kBFloat16: return "bfloat16";
    case DType::kFloat16: return "float16";
    case DType::kFloat32: return "float32";
    case DType::kFloat64: return "float64";
  }
  return "?";
}

inline float bf16_to_float(uint16_t h) { return std::bit_cast<float>(uint32_t(h) << 16); }

inline uint16_t float_to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if (std::isnan(f)) return uint16_t((u >> 16) | 0x40);  // keep NaN a NaN (quiet)
  u += 0x7fff + ((u >> 16) & 1);
  return uint16_t(u >> 16);
}

inline float fp16_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t man = h & 0x3ff;
  if (exp == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (man << 13));
  if (exp != 0) return std::bit_cast<float>(sign | ((exp + 112) << 23) | (man << 13));
  const float mag = std::ldexp(float(man), -24);  // subnormal or zero
  return sign ? -mag : mag;
}

inline uint16_t float_to_fp16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000);
  const float a = std::fabs(f);
  if (std::isnan(f)) return uint16_t(sign | 0x7e00);
  if (a >= 65520.0f) return uint16_t(sign | 0x7c00);  // rounds to infinity
  if (a < 6.103515625e-05f) {  // subnormal range: multiples of 2^-24, nearest even via rint
    return uint16_t(sign | uint16_t(std::nearbyint(std::ldexp(a, 24))));
  }
  const uint32_t ua = std::bit_cast<uint32_t>(a);
  uint32_t rounded = ua + 0xfff + ((ua >> 13) & 1);
  return uint16_t(sign | uint16_t(((rounded >> 23) - 112) << 10 | ((rounded >> 13) & 0x3ff)));
}

// Reads element i of a buffer of dtype t as float.
inline float load_as_float(const void* base, int64_t i, DType t) {
  switch (t) {
    case DType::kBFloat16: return bf16_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::kFloat16: return fp16_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::kFloat32: return static_cast<const float*>(base)[i];
    case DType::kFloat64: return float(static_cast<const double*>(base)[i]);
  }
  return NAN;
}

// Writes v, rounded to dtype t, to element i of a buffer.
inline void store_from_float(void* base, int64_t i, DType t, float v) {
  switch (t) {
    case DType::kBFloat16: static_cast<uint16_t*>(base)[i] = float_to_bf16(v); return;
    case DType::kFloat16: static_cast<uint16_t*>(base)[i] = float_to_fp16(v); return;
    case DType::kFloat32: static_cast<float*>(base)[i] = v; return;
    case DType::kFloat64: static_cast<double*>(base)[i] = v; return;
  }
}

// Reads element i as double: exact for every dtype.
inline double load_as_double(const void* base, int64_t i, DType t) {
  return t == DType::kFloat64 ? static_cast<const double*>(base)[i] : double(load_as_float(base, i, t));
}

// Writes v to element i: fp64 as is; the other dtypes rounded to float32 first, then to dtype t.
inline void store_from_double(void* base, int64_t i, DType t, double v) {
  if (t == DType::kFloat64) {
    static_cast<double*>(base)[i] = v;
    return;
  }
  store_from_float(base, i, t, float(v));
}

}  // namespace qksoftmax
