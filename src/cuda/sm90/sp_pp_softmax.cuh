// The pingpong single pass's element-wise work (sp_pp_mainloop.cuh): a consumer holds S = Q Kᵀ of its block,
// (64 rows, 128 keys), a thread 2 rows × 32 keys, a row's keys in the 4 lanes of a quad, so that a row's
// statistics are the warpgroup's own, 2 shuffles per reduction. For each row, over the keys it sees:
//   x = S·scale·log2e (one FFMA inside the exponent), m = max x, p = 2^(x − m), l = Σ p, u = Σ p · dP;
//   f = fold / l, fd = f · u / l (D = u / l);
//   dS = p · (dP · f − fd) = P ∘ (dP − D) · fold, 0 where the row does not see the key,
// fold = |scale| where dS carries the scale (bf16; dQ and dK then take its sign), 1 otherwise (they take it).
#pragma once

#include "cuda/sm90/sp_pp_config.h"

namespace qksoftmax::cuda::sm90 {

template <class Cfg>
struct SpPpSoftmax {
  using Element = typename Cfg::Element;
  using BM = typename Cfg::BM;
  using BN = typename Cfg::BN;
  using MmaS = typename Cfg::MmaS;
  using FragS = decltype(partition_fragment_C(MmaS{}, Shape<BM, BN>{}));  // (MMA, 1, 1) fp32
  using FragS16 = decltype(make_fragment_like<Element>(FragS{}));        // (MMA, 1, 1)
  using RowCol = decltype(rowcol(typename FragS::layout_type{}));         // (rows, keys)
  static constexpr int kRows = size<0>(RowCol{});
  static constexpr int kKeys = size<1>(RowCol{});
  static_assert(kRows == 2 && kKeys == 32, "a thread holds 2 rows × 32 keys of S, a row in a quad");
  static constexpr int kQuad = 4;
  static constexpr int kSums = 4;  // independent partial sums per row (the FFMA chains of u)

  KeyRange keys;
  float scale_log2;  // scale · log2(e)
  float fold;
  int tid;  // within the warpgroup

  // The (row, key) of each of this thread's values of S, within the block.
  __device__ auto coords() const {
    Tensor tScS = MmaS{}.get_thread_slice(tid).partition_C(make_identity_tensor(Shape<BM, BN>{}));  // (MMA, 1, 1)
    return make_tensor(tScS.data(), rowcol(tScS.layout()));                                       // (rows, keys)
  }

  // Whether the block of rows [m0, m0 + 64) has keys that some row does not see (its element-wise code then
  // masks; a block without is compiled without the compares).
  __device__ bool cut(int64_t m0) const { return keys.cuts(m0, Cfg::kBlockM, 0, Cfg::kBlockN); }

  // The statistics of the block's rows: S (overwritten) into p, masked, and each row's factors f and fd.
  __device__ void stats(FragS& tSrS, const FragS16& tSrdP, int64_t m0, bool is_cut, float (&f)[kRows],
                        float (&fd)[kRows]) const {
    Tensor s = make_tensor(tSrS.data(), RowCol{});          // (rows, keys)
    const Tensor dp = make_tensor(tSrdP.data(), RowCol{});  // (rows, keys)
    // x = s · k inside the exponent, 2^(s · k − m), m = k · max s: k = scale·log2e where that is positive;
    // otherwise S is scaled first and k = 1.
    const bool prescale = !(scale_log2 > 0.0f);
    if (prescale) {
      CUTE_UNROLL
      for (int i = 0; i < size(tSrS); ++i) tSrS(i) *= scale_log2;
    }
    const float k = prescale ? 1.0f : scale_log2;
    const auto rows = [&](auto cut_kind) {
      constexpr bool kCut = decltype(cut_kind)::value;
      if constexpr (kCut) {  // −inf where the row does not see the key (causal, keys past Sk, rows past Sq)
        const auto rc = coords();  // (rows, keys) → (row, key)
        CUTE_UNROLL
        for (int ri = 0; ri < kRows; ++ri) {
          const int end = keys.cols_in(m0 + get<0>(rc(ri, 0)), 0, Cfg::kBlockN);
          CUTE_UNROLL
          for (int ci = 0; ci < kKeys; ++ci) s(ri, ci) = get<1>(rc(ri, ci)) < end ? s(ri, ci) : -INFINITY;
        }
      }
      // Both rows at each stage, so that their dependency chains (trees, shuffles) overlap.
      float ref[kRows];
      CUTE_UNROLL
      for (int ri = 0; ri < kRows; ++ri) {
        float v[kKeys];
        CUTE_UNROLL
        for (int ci = 0; ci < kKeys; ++ci) v[ci] = s(ri, ci);
        ref[ri] = tree_reduce(v, MaxOp{});
      }
      CUTE_UNROLL
      for (int off = 1; off < kQuad; off *= 2) {
        CUTE_UNROLL
        for (int ri = 0; ri < kRows; ++ri) ref[ri] = fmaxf(ref[ri], __shfl_xor_sync(0xffffffffu, ref[ri], off));
      }
      CUTE_UNROLL
      for (int ri = 0; ri < kRows; ++ri) {
        const float m = ref[ri] * k;
        ref[ri] = m == -INFINITY ? 0.0f : m;  // a row that sees no key: p = 0, l = 0
      }
      float l[kRows][kSums] = {}, u[kRows][kSums] = {};
      CUTE_UNROLL
      for (int ci = 0; ci < kKeys; ++ci) {
        CUTE_UNROLL
        for (int ri = 0; ri < kRows; ++ri) {
          const float p = exp2_fast(fmaf(s(ri, ci), k, -ref[ri]));
          s(ri, ci) = p;
          l[ri][ci % kSums] += p;
          // A masked key (p = 0) adds nothing whatever dP holds there (NaN included).
          const float d = kCut && p == 0.0f ? 0.0f : float(dp(ri, ci));
          u[ri][ci % kSums] = fmaf(p, d, u[ri][ci % kSums]);
        }
      }
      CUTE_UNROLL
      for (int ri = 0; ri < kRows; ++ri) {
        f[ri] = tree_reduce(l[ri], SumOp{});
        fd[ri] = tree_reduce(u[ri], SumOp{});
      }
    };
    if (is_cut) {
      rows(std::true_type{});
    } else {
      rows(std::false_type{});
    }
    quad_sum_rows<kQuad>(f, fd);
    CUTE_UNROLL
    for (int ri = 0; ri < kRows; ++ri) {
      const float inv = f[ri] > 0.0f ? rcp_fast(f[ri]) : 0.0f;
      f[ri] = inv * fold;
      fd[ri] = f[ri] * (fd[ri] * inv);
    }
  }

  // dS = p · (dP · f − fd) into tSrdS, from p (stats) and dP.
  __device__ void ds(const FragS& tSrS, const FragS16& tSrdP, bool is_cut, const float (&f)[kRows],
                     const float (&fd)[kRows], FragS16& tSrdS) const {
    const Tensor s = make_tensor(tSrS.data(), RowCol{});    // (rows, keys)
    const Tensor dp = make_tensor(tSrdP.data(), RowCol{});  // (rows, keys)
    Tensor ds = make_tensor(tSrdS.data(), RowCol{});        // (rows, keys)
    const auto elementwise = [&](auto cut_kind) {
      constexpr bool kCut = decltype(cut_kind)::value;
      CUTE_UNROLL
      for (int ri = 0; ri < kRows; ++ri) {
        CUTE_UNROLL
        for (int ci = 0; ci < kKeys; ++ci) {
          const float p = s(ri, ci);
          const float d = p * fmaf(float(dp(ri, ci)), f[ri], -fd[ri]);
          ds(ri, ci) = Element(kCut && p == 0.0f ? 0.0f : d);
        }
      }
    };
    if (is_cut) {
      elementwise(std::true_type{});
    } else {
      elementwise(std::false_type{});
    }
  }
};

}  // namespace qksoftmax::cuda::sm90
