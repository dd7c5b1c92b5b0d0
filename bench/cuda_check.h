// Turns CUDA runtime and cuBLAS status codes into Results.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

#include "result.h"

namespace qkbench {

inline Result cuda_result(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return {};
  return Result(std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

inline Result cublas_result(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return {};
  return Result(std::string(what) + ": " + cublasGetStatusName(s) + " (" + cublasGetStatusString(s) + ")");
}

// The error of the last kernel launch, if any (does not synchronise).
inline Result launch_result(const char* kernel) { return cuda_result(cudaGetLastError(), kernel); }

}  // namespace qkbench

#define QKB_CUDA(call) QKB_TRY(::qkbench::cuda_result((call), #call))
#define QKB_CUBLAS(call) QKB_TRY(::qkbench::cublas_result((call), #call))
