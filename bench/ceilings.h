// The ceilings of the SOL model, measured on this GPU in this run (docs/SPEC.md, section 6).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "model.h"
#include "result.h"

namespace qkbench {

// Copy bandwidth: cudaMemcpyAsync device-to-device of 2 GiB, (bytes read + written) / time, median of
// several. GEMM rates: cuBLAS 8192³ on random normal data, median of several; bf16 and fp16 with fp32
// accumulation, fp32 with TF32 allowed (CUBLAS_COMPUTE_32F_FAST_TF32) and plain fp32.
Result measure_ceilings(cudaStream_t stream, cublasHandle_t cublas, Ceilings* ceilings);

}  // namespace qkbench
