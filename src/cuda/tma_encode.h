// Every TMA descriptor that CuTe's make_tma_copy encodes goes through encode_tma_tiled (device.cu).
//
// CuTe calls the driver's cuTensorMapEncodeTiled through cutlass::call_cuTensorMapEncodeTiled, which looks the
// entry point up again for each descriptor; on failure it prints the descriptor to stderr, asserts (compiled
// out in release builds) and returns a descriptor that a kernel would then read as garbage. The explicit
// specialisation below sends the call to encode_tma_tiled instead: it resolves the entry point once per
// process, and records a failure for the launch to return as a Status (take_tma_failure, device.h), reporting
// success to CuTe so that nothing is printed; the failed descriptor is never launched. Include this header
// before anything instantiates make_tma_copy (generic_launch.cuh includes it for every launcher).
#pragma once

#include <cuda.h>

#include <cstdint>
#include <cutlass/cuda_host_adapter.hpp>

namespace qksoftmax::cuda {

// cuTensorMapEncodeTiled's parameters; returns CUDA_SUCCESS, a failure being recorded for take_tma_failure.
CUresult encode_tma_tiled(CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank, void* address,
                          const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box,
                          const cuuint32_t* element_strides, CUtensorMapInterleave interleave,
                          CUtensorMapSwizzle swizzle, CUtensorMapL2promotion promotion,
                          CUtensorMapFloatOOBfill fill) noexcept;

}  // namespace qksoftmax::cuda

namespace cutlass {

// The argument types of CuTe's call in make_tma_copy_desc (cute/atom/copy_traits_sm90_tma.hpp).
template <>
inline CUresult call_cuTensorMapEncodeTiled(CUtensorMap* map, CUtensorMapDataType type, int rank, void* address,
                                            uint64_t* dims, uint64_t* strides, uint32_t* box,
                                            uint32_t* element_strides, CUtensorMapInterleave interleave,
                                            CUtensorMapSwizzle swizzle, CUtensorMapL2promotion promotion,
                                            CUtensorMapFloatOOBfill fill) {
  return qksoftmax::cuda::encode_tma_tiled(map, type, cuuint32_t(rank), address, dims, strides, box,
                                           element_strides, interleave, swizzle, promotion, fill);
}

}  // namespace cutlass
