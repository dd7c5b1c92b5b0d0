// Which tensors TMA can address: the dispatch's test for the Hopper kernels' operands, and the single pass's for
// dK (stored by TMA where it can be, from registers otherwise).
#pragma once

#include <cstddef>
#include <cstdint>

#include "problem.h"

namespace qksoftmax::cuda {

constexpr int64_t kTmaAlignmentBytes = 16;
constexpr int64_t kTmaStrideLimitBytes = int64_t(1) << 40;  // cuTensorMapEncodeTiled: strides below 2^40 bytes

// TMA needs a 16-byte aligned base and strides that are positive multiples of 16 bytes below 2^40 bytes
// (a broadcast, stride-0 dimension takes the generic path).
inline bool tma_stride(int64_t stride, int64_t element_bytes) {
  return stride > 0 && stride < kTmaStrideLimitBytes / element_bytes &&
         (stride * element_bytes) % kTmaAlignmentBytes == 0;
}
inline bool tma_compatible(const Operand& op, size_t element_bytes) {
  const int64_t e = int64_t(element_bytes);
  return reinterpret_cast<uintptr_t>(op.ptr) % kTmaAlignmentBytes == 0 && tma_stride(op.sb, e) &&
         tma_stride(op.sh, e) && tma_stride(op.sr, e);
}

}  // namespace qksoftmax::cuda
