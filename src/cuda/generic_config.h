// Compile-time configuration of the generic (portable, any-shape) kernels: one per (dtype, head dim),
// read by the kernels and by the host code that launches them.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/bfloat16.h>
#include <cutlass/half.h>

#include "qksoftmax/qksoftmax.h"

namespace qksoftmax::cuda {

template <class Element>
struct ElementTraits;

template <>
struct ElementTraits<cutlass::bfloat16_t> {
  static constexpr DType kDType = DType::kBFloat16;
  // 16-bit operands go through the tensor cores (fp32 accumulation).
  using MmaAtom = cute::SM80_16x8x16_F32BF16BF16F32_TN;
};

template <>
struct ElementTraits<cutlass::half_t> {
  static constexpr DType kDType = DType::kFloat16;
  using MmaAtom = cute::SM80_16x8x16_F32F16F16F32_TN;
};

template <>
struct ElementTraits<float> {
  static constexpr DType kDType = DType::kFloat32;
  // fp32 results must be fp32-accurate: plain TF32 tensor-core products are not, so FMA.
  using MmaAtom = cute::UniversalFMA<float, float, float, float>;
};

template <class Element_, int kHeadDim_>
struct GenericConfig {
  using Element = Element_;
  static constexpr DType kDType = ElementTraits<Element>::kDType;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = 64;  // query rows of a tile
  static constexpr int kBlockN = 64;  // key columns of a tile
  static constexpr int kThreads = 128;
  static constexpr int kWarps = kThreads / 32;
  static constexpr bool kTensorCores = sizeof(Element) == 2;

  // Shared-memory rows are padded by 16 bytes so that column walks do not hit one bank.
  static constexpr int kPadBytes = 16;
  static constexpr int kRowStride = kHeadDim + kPadBytes / int(sizeof(Element));  // sQ, sK
  static constexpr int kScoreStride = kBlockN + kPadBytes / int(sizeof(float));     // sS
  static constexpr int kDsStride = kBlockN + kPadBytes / int(sizeof(Element));      // sdS

  // Four warps as 2 × 2 tensor-core atoms (a 32 × 32 tile per step), or 16 × 8 FMA threads for fp32.
  using TiledMma = std::conditional_t<
      kTensorCores,
      decltype(cute::make_tiled_mma(typename ElementTraits<Element>::MmaAtom{},
                                    cute::Layout<cute::Shape<cute::_2, cute::_2, cute::_1>>{},
                                    cute::Tile<cute::_32, cute::_32, cute::_16>{})),
      decltype(cute::make_tiled_mma(typename ElementTraits<Element>::MmaAtom{},
                                    cute::Layout<cute::Shape<cute::_16, cute::_8, cute::_1>>{}))>;
  static_assert(cute::size(TiledMma{}) == kThreads);
  // Reduction depth of one cooperative_gemm call: bounds the operand registers a thread holds.
  static constexpr int kGemmK = kTensorCores ? 32 : 4;

  struct SharedStorage {
    alignas(16) Element q[kBlockM * kRowStride];
    alignas(16) Element k[kBlockN * kRowStride];
    alignas(16) float s[kBlockM * kScoreStride];
    alignas(16) Element ds[kBlockM * kDsStride];
    alignas(16) float lse[kBlockM];
    alignas(16) float delta[kBlockM];
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));
};

}  // namespace qksoftmax::cuda
