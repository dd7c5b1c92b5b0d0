// Hopper backward, the last pass where dQ is added through the fp32 accumulator (rows of more than
// kSm90DirectDqMaxSk keys, or a dQ out of TMA's reach): dQ = the accumulator, in dQ's dtype. The key-block pass
// adds finished partials (KbFinish: the scale is in dS or applied before the reduce-add), so none is applied here.
#pragma once

#include "cuda/sm90_config.h"

namespace qksoftmax::cuda::sm90 {

// dq = dq_accum, converted. A CTA takes items of kConvertItemRows rows of one (b, h), grid-strided;
// kHeadDim / 4 consecutive threads share a row (four head dimensions each), and each thread has kBatch rows'
// loads in flight before it stores.
inline constexpr int64_t kConvertItemRows = 256;
template <class Element, int kHeadDim>
__global__ void convert_dq_kernel(const Problem prob, const float* dq_accum) {
  constexpr int kLanes = kHeadDim / 4, kBatch = 8;
  static_assert(kLanes <= 32 && 32 % kLanes == 0, "a row is at most one warp of float4s");
  const bool vector = aligned_rows<Element>(prob.dq, 4);  // (on the GPU rows have stride 1: validate.cpp)
  const int d = 4 * int(threadIdx.x % kLanes);
  const int64_t stride = blockDim.x / kLanes;  // rows per pass of the CTA
  const int64_t chunks = (prob.Sq + kConvertItemRows - 1) / kConvertItemRows;
  for (int64_t item = blockIdx.x; item < prob.B * prob.Hq * chunks; item += gridDim.x) {
    const int64_t head = item / chunks, b = head / prob.Hq, h = head % prob.Hq;
    const int64_t r_begin = item % chunks * kConvertItemRows, r_end = min(r_begin + kConvertItemRows, prob.Sq);
    const float4* accum = reinterpret_cast<const float4*>(dq_accum + dq_accum_offset(prob, b, h, 0));
    Element* dq = static_cast<Element*>(prob.dq.ptr) + prob.dq.offset(b, h, 0, 0);
    for (int64_t r0 = r_begin + threadIdx.x / kLanes; r0 < r_end; r0 += kBatch * stride) {
      float4 v[kBatch];  // all loaded first: for the compiler the stores below could alias them
      CUTE_UNROLL
      for (int k = 0; k < kBatch; ++k) {
        const int64_t r = r0 + k * stride;
        v[k] = r < r_end ? __ldcg(accum + r * kLanes + d / 4) : make_float4(0.f, 0.f, 0.f, 0.f);
      }
      CUTE_UNROLL
      for (int k = 0; k < kBatch; ++k) {
        const int64_t r = r0 + k * stride;
        if (r >= r_end) break;
        store_converted(dq + r * prob.dq.sr + d, v[k], vector);
      }
    }
  }
}

}  // namespace qksoftmax::cuda::sm90
