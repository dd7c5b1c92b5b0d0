// The CUDA backend's entry points: pointer checks, workspace size, and the choice of kernel family.
#include <cuda_runtime.h>

#include <string>

#include "cuda/cuda_backend.h"
#include "cuda/generic_instances.h"
#include "cuda/generic_launch.cuh"

namespace qksoftmax::cuda {
namespace {

struct NamedOperand {
  const char* name;
  const Operand& op;
};

}  // namespace

Status check_pointers(const Problem& prob) {
  int device = 0;
  if (cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) {
    cudaGetLastError();
    return {Code::kCudaError, std::string("no usable CUDA device: ") + cudaGetErrorString(err)};
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

size_t workspace_size(const Problem& prob) { return GenericWorkspace::of(prob).bytes(prob); }

Status run(const Problem& prob, void* workspace, CUstream_st* stream) {
#define QKSOFTMAX_DISPATCH_GENERIC(T, HD)                                              \
  if (prob.dtype == ElementTraits<T>::kDType && prob.D == HD) {                        \
    return run_generic<GenericConfig<T, HD>>(prob, workspace, stream);                 \
  }
  QKSOFTMAX_GENERIC_CONFIGS(QKSOFTMAX_DISPATCH_GENERIC)
#undef QKSOFTMAX_DISPATCH_GENERIC
  return {Code::kUnsupported, "the CUDA backend supports head dimensions 64 and 128, got " +
                                  std::to_string(prob.D) + " (the CPU backend supports any)"};
}

}  // namespace qksoftmax::cuda
