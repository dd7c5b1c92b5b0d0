// The unfused cuBLAS baseline (impl "cublas_unfused"): the classic approach the fused kernels replace.
//   forward:   S = scale·Q Kᵀ (strided-batched GEMM, dense, into P's memory), then a row softmax in place
//              writing P (0 where masked) and LSE.
//   saved_p:   a softmax-backward kernel (D_i = Σ_j P_ij dP_ij over the live row; dS = P ∘ (dP − D), 0 where
//              masked) writes dS, then two strided-batched GEMMs: dQ = scale·dS K, dK = scale·dSᵀ Q.
//   recompute: the forward's GEMM and softmax into scratch, then the saved_p steps on that P (in place).
// GEMMs accumulate in fp32 (plain fp32 for fp32 data: no TF32) and run over the whole S × S, masked part
// included, as the classic approach does.
#pragma once

#include <cublas_v2.h>

#include <memory>

#include "impl.h"

namespace qkbench {

std::unique_ptr<Impl> make_cublas_unfused_impl(cublasHandle_t cublas);

}  // namespace qkbench
