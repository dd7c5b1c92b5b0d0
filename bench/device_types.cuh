// Conversions between float and the storage types in device code, and the launch of a kernel templated on
// the storage type of a DType.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda_check.h"
#include "model.h"

namespace qkbench {

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// Calls launch(T{}) with T the storage type of dtype, then reports the launch's error, if any.
template <typename Launch>
Result launch_for_dtype(DType dtype, const char* kernel, Launch&& launch) {
  switch (dtype) {
    case DType::kBFloat16: launch(__nv_bfloat16{}); break;
    case DType::kFloat16: launch(__half{}); break;
    case DType::kFloat32: launch(float{}); break;
    case DType::kFloat64: return Result(std::string(kernel) + ": float64 is not benchmarked on the GPU");
  }
  return launch_result(kernel);
}

}  // namespace qkbench
