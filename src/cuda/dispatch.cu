// The CUDA backend's entry points: pointer checks, workspace size, and the choice of kernel family.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "cuda/cuda_backend.h"
#include "cuda/generic_instances.h"
#include "cuda/generic_launch.cuh"
#include "cuda/sm90_backward_launch.cuh"
#include "cuda/sm90_instances.h"

namespace qksoftmax::cuda {
namespace {

struct NamedOperand {
  const char* name;
  const Operand& op;
};

constexpr int kHopperMajor = 9;
constexpr int64_t kTmaAlignmentBytes = 16;
constexpr int64_t kTmaStrideLimitBytes = int64_t(1) << 40;  // cuTensorMapEncodeTiled: strides below 2^40 bytes
constexpr int64_t kSm90HeadDim = 128;

// Backward shapes of the Hopper kernels, whatever the pointers.
bool sm90_backward_shape(const Problem& prob) {
  return prob.pass == Pass::kBackward && prob.dtype != DType::kFloat32 && prob.D == kSm90HeadDim;
}
// The shapes the two-pass Hopper backward may take (its dQ atomics reorder sums: not when deterministic);
// the workspace size depends on this only.
bool sm90_shape(const Problem& prob) { return sm90_backward_shape(prob) && !prob.deterministic; }

// TMA needs a 16-byte aligned base and strides that are positive multiples of 16 bytes below 2^40 bytes
// (a broadcast, stride-0 dimension takes the generic path).
bool tma_stride(int64_t stride, int64_t element_bytes) {
  return stride > 0 && stride < kTmaStrideLimitBytes / element_bytes &&
         (stride * element_bytes) % kTmaAlignmentBytes == 0;
}
bool tma_compatible(const Operand& op, size_t element_bytes) {
  const int64_t e = int64_t(element_bytes);
  return reinterpret_cast<uintptr_t>(op.ptr) % kTmaAlignmentBytes == 0 && tma_stride(op.sb, e) &&
         tma_stride(op.sh, e) && tma_stride(op.sr, e);
}

bool on_hopper() {
  int device = 0, major = 0;
  return cudaGetDevice(&device) == cudaSuccess &&
         cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
         major == kHopperMajor;
}

// The fused forward: 16-bit, D = 128, q, k and p in TMA reach (P is stored by TMA).
bool sm90_forward_eligible(const Problem& prob) {
  const size_t e = dtype_size(prob.dtype);
  return prob.pass == Pass::kForward && prob.dtype != DType::kFloat32 && prob.D == kSm90HeadDim &&
         tma_compatible(prob.q, e) && tma_compatible(prob.k, e) && tma_compatible(prob.out_p, e);
}

bool sm90_tma_ready(const Problem& prob) {
  const size_t e = dtype_size(prob.dtype);
  return sm90_backward_shape(prob) && tma_compatible(prob.q, e) && tma_compatible(prob.k, e) &&
         tma_compatible(prob.dp, e) && (!prob.p.present() || tma_compatible(prob.p, e));
}

// The fused backward serves deterministic calls (it sums in a fixed order, no atomics) on the rows it takes
// (given TMA-ready tensors). Elsewhere the two-pass backward is faster: seed16 bf16 on the H200
// (2026-11-30, 15:48–15:54Z) saved-P 535 µs mean against the fused kernel's 936, recompute 623 against 862; the fused
// kernel won only at B ≤ 2, S ≤ 256, by at most 13 % (docs/PERFORMANCE.md, v5).
bool sm90_fused_fits(const Problem& prob) {
  return prob.deterministic && prob.Sk <= kSm90FusedMaxSk;
}

// Why no CUDA device can be used, in the caller's terms: without a driver the runtime reports an "insufficient"
// driver (version 0).
std::string no_device_reason(cudaError_t err) {
  int driver_version = 0;
  if (err == cudaErrorInsufficientDriver && cudaDriverGetVersion(&driver_version) == cudaSuccess &&
      driver_version == 0) {
    return "no CUDA driver is installed";
  }
  return cudaGetErrorString(err);
}

}  // namespace

Status check_pointers(const Problem& prob) {
  int device = 0;
  if (cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) {
    cudaGetLastError();
    return {Code::kCudaError, "q: no CUDA device is available (" + no_device_reason(err) +
                                  "); Device::kCPU runs the CPU backend"};
  }
  const NamedOperand operands[] = {{"q", prob.q},   {"k", prob.k},   {"p", prob.p},
                                   {"dp", prob.dp}, {"lse", prob.lse}, {"p", prob.out_p},
                                   {"lse", prob.out_lse}, {"dq", prob.dq}, {"dk", prob.dk}};
  for (const NamedOperand& o : operands) {
    if (!o.op.present()) continue;
    cudaPointerAttributes attr{};
    const cudaError_t err = cudaPointerGetAttributes(&attr, o.op.ptr);
    if (err != cudaSuccess) cudaGetLastError();
    const bool on_device = err == cudaSuccess &&
                           (attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged);
    if (!on_device || attr.device != device) {
      return {Code::kInvalidArgument, std::string(o.name) + ": data is not memory of the current CUDA device " +
                                          std::to_string(device) + " (device tensors were declared)"};
    }
  }
  return {};
}

size_t workspace_size(const Problem& prob) {
  return GenericWorkspace::of(prob).bytes(prob) + (sm90_shape(prob) ? dq_accum_bytes(prob) : 0);
}

Status run(const Problem& prob, void* workspace, CUstream_st* stream) {
  // A launch's error is read back as the thread's last error: one that an earlier runtime call left there (the
  // caller's failed cudaMalloc, say), already returned by that call, must not be taken for this call's.
  cudaGetLastError();
  if (!on_hopper()) {
    return {Code::kUnsupported, "q: the CUDA backend is built for Hopper (sm_90a) only; use the CPU backend"};
  }
  if (sm90_forward_eligible(prob)) {
#define QKSOFTMAX_DISPATCH_SM90_FORWARD(T, HD)                                         \
    if (prob.dtype == ElementTraits<T>::kDType && prob.D == HD) {                      \
      return run_sm90_forward<sm90::ForwardConfig<T, HD>>(prob, stream);             \
    }
    QKSOFTMAX_SM90_CONFIGS(QKSOFTMAX_DISPATCH_SM90_FORWARD)
#undef QKSOFTMAX_DISPATCH_SM90_FORWARD
  }
  const bool sm90_backward = sm90_tma_ready(prob);
  if (sm90_backward && sm90_fused_fits(prob)) {
    const bool saved_p = prob.mode == BackwardMode::kSavedP;
#define QKSOFTMAX_DISPATCH_SM90_FUSED(T, HD, SAVED_P)                                   \
    if (prob.dtype == ElementTraits<T>::kDType && prob.D == HD && saved_p == SAVED_P) { \
      return run_sm90_fused<sm90::FusedConfig<T, HD, SAVED_P>>(prob, stream);          \
    }
    QKSOFTMAX_SM90_FUSED_CONFIGS(QKSOFTMAX_DISPATCH_SM90_FUSED)
#undef QKSOFTMAX_DISPATCH_SM90_FUSED
  }
  if (sm90_backward && !prob.deterministic) {
#define QKSOFTMAX_DISPATCH_SM90(T, HD)                                                 \
    if (prob.dtype == ElementTraits<T>::kDType && prob.D == HD) {                      \
      return run_sm90_backward<sm90::Config<T, HD>>(prob, workspace, stream);    \
    }
    QKSOFTMAX_SM90_CONFIGS(QKSOFTMAX_DISPATCH_SM90)
#undef QKSOFTMAX_DISPATCH_SM90
  }
#define QKSOFTMAX_DISPATCH_GENERIC(T, HD)                                              \
  if (prob.dtype == ElementTraits<T>::kDType && prob.D == HD) {                        \
    return run_generic<GenericConfig<T, HD>>(prob, workspace, stream);                 \
  }
  QKSOFTMAX_GENERIC_CONFIGS(QKSOFTMAX_DISPATCH_GENERIC)
#undef QKSOFTMAX_DISPATCH_GENERIC
  return {Code::kUnsupported, "q: the CUDA backend supports head dimensions 64 and 128, got " +
                                  std::to_string(prob.D) + " (the CPU backend supports any)"};
}

}  // namespace qksoftmax::cuda
