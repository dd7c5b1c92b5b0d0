// The pingpong single pass's element-wise work (sp_pp_mainloop.cuh): a consumer holds S = Q Kᵀ of its block,
// (64 rows, the CTA's 128 keys from n0), a thread 2 rows × 32 keys, a row's keys in the 4 lanes of a quad, so that a
// row's sums over the CTA's keys are the warpgroup's own, 2 shuffles per reduction. For each row, over the
// keys it sees:
//   x = S·scale·log2e (one FFMA inside the exponent), m = max x, p = 2^(x − m), l = Σ p, u = Σ p · dP;
//   one CTA: f = fold / l, fd = f · u / l (D = u / l); in a cluster, with the other CTAs' statistics
//   (sp_pp_exchange.cuh): f = fold · 2^(m − LSE), fd = f · D;
//   dS = p · (dP · f − fd) = P ∘ (dP − D) · fold, 0 where the row does not see the key,
// fold = |scale| where dS carries the scale (bf16; dQ and dK then take its sign), 1 otherwise (they take it).
// Saved-P: P given (read into 16-bit registers, 0 where the row does not see the key), u = Σ P · dP, D = u (one
// CTA) or the sum of the cluster's partials; f = fold, fd = fold · D, where fold = scale (signed) in bf16.
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

  // `fill` in place of each value of x (rows, keys) whose row, of the block from row m0, does not see its key of the
  // CTA's (from n0).
  template <class X, class T>
  __device__ void mask_unseen(X& x, int64_t m0, int64_t n0, T fill) const {
    const auto rc = coords();  // (rows, keys) → (row, key)
    CUTE_UNROLL
    for (int ri = 0; ri < kRows; ++ri) {
      const int end = keys.cols_in(m0 + get<0>(rc(ri, 0)), n0, Cfg::kBlockN);
      CUTE_UNROLL
      for (int ci = 0; ci < kKeys; ++ci) x(ri, ci) = get<1>(rc(ri, ci)) < end ? x(ri, ci) : fill;
    }
  }

  // Whether the block of rows [m0, m0 + 64) has keys of the CTA (from n0) that some row does not see (its
  // element-wise code then masks; a block without is compiled without the compares).
  __device__ bool cut(int64_t m0, int64_t n0) const { return keys.cuts(m0, Cfg::kBlockM, n0, Cfg::kBlockN); }

  // The sums of the block's rows over the CTA's keys: S (overwritten) into p, masked, and each row's m (0 where the
  // row sees none of the keys), l and u (of every lane of its quad).
  __device__ void sums(FragS& tSrS, const FragS16& tSrdP, int64_t m0, int64_t n0, bool is_cut,
                       float (&m_out)[kRows], float (&l_out)[kRows], float (&u_out)[kRows]) const {
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
      if constexpr (kCut) mask_unseen(s, m0, n0, -INFINITY);  // (causal, keys past Sk, rows past Sq)
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
          const float d = kCut && p == 0.0f ? 0.0f : value(dp, ri, ci);
          u[ri][ci % kSums] = fmaf(p, d, u[ri][ci % kSums]);
        }
      }
      CUTE_UNROLL
      for (int ri = 0; ri < kRows; ++ri) {
        m_out[ri] = ref[ri];
        l_out[ri] = tree_reduce(l[ri], SumOp{});
        u_out[ri] = tree_reduce(u[ri], SumOp{});
      }
    };
    if (is_cut) {
      rows(std::true_type{});
    } else {
      rows(std::false_type{});
    }
    quad_sum_rows<kQuad>(l_out, u_out);
  }

  // Saved-P: P (16-bit, masked in place: 0 where the row does not see the key, whatever it held) and each row's
  // u = Σ P · dP over the CTA's keys (of every lane of its quad).
  __device__ void saved_sums(FragS16& tSrP, const FragS16& tSrdP, int64_t m0, int64_t n0, bool is_cut,
                             float (&u_out)[kRows]) const {
    Tensor p = make_tensor(tSrP.data(), RowCol{});          // (rows, keys)
    const Tensor dp = make_tensor(tSrdP.data(), RowCol{});  // (rows, keys)
    const auto rows = [&](auto cut_kind) {
      constexpr bool kCut = decltype(cut_kind)::value;
      if constexpr (kCut) mask_unseen(p, m0, n0, Element(0.0f));
      float u[kRows][kSums] = {};
      CUTE_UNROLL
      for (int ci = 0; ci < kKeys; ++ci) {
        CUTE_UNROLL
        for (int ri = 0; ri < kRows; ++ri) {
          const float pv = value(p, ri, ci);
          // A masked key (P = 0) adds nothing whatever dP holds there (NaN included).
          const float d = kCut && pv == 0.0f ? 0.0f : value(dp, ri, ci);
          u[ri][ci % kSums] = fmaf(pv, d, u[ri][ci % kSums]);
        }
      }
      CUTE_UNROLL
      for (int ri = 0; ri < kRows; ++ri) u_out[ri] = tree_reduce(u[ri], SumOp{});
    };
    if (is_cut) {
      rows(std::true_type{});
    } else {
      rows(std::false_type{});
    }
    CUTE_UNROLL
    for (int ri = 0; ri < kRows; ++ri) u_out[ri] = quad_sum<kQuad>(u_out[ri]);
  }

  // Saved-P: the factors of dS from a row's D (f = fold, fd = fold · D).
  __device__ void saved_factors(const float (&d)[kRows], float (&f)[kRows], float (&fd)[kRows]) const {
    CUTE_UNROLL
    for (int ri = 0; ri < kRows; ++ri) {
      f[ri] = fold;
      fd[ri] = fold * d[ri];
    }
  }

  // The factors of dS where the CTA holds every key of the rows: from l and u (sums; f, fd in place of them).
  __device__ void factors(float (&f)[kRows], float (&fd)[kRows]) const {
    CUTE_UNROLL
    for (int ri = 0; ri < kRows; ++ri) {
      const float inv = f[ri] > 0.0f ? rcp_fast(f[ri]) : 0.0f;
      f[ri] = inv * fold;
      fd[ri] = f[ri] * (fd[ri] * inv);
    }
  }

  // A row's (LSE, D) over the CTA's keys, in log2 units, from its sums: (−inf, 0) where it sees none of them.
  __device__ static float2 partial(float m, float l, float u) {
    return l > 0.0f ? make_float2(m + log2_fast(l), u * rcp_fast(l)) : make_float2(-INFINITY, 0.0f);
  }

  // The factors of dS from m and the cluster's combination of the rows' partials (SpPpExchange::combine): the
  // largest LSE_r (`top`), Σ_r 2^(LSE_r − top) and Σ_r 2^(LSE_r − top) D_r.
  __device__ void factors_of(const float (&m)[kRows], const float (&top)[kRows], const float (&sum)[kRows],
                             const float (&d)[kRows], float (&f)[kRows], float (&fd)[kRows]) const {
    CUTE_UNROLL
    for (int ri = 0; ri < kRows; ++ri) {
      const float inv = sum[ri] > 0.0f ? rcp_fast(sum[ri]) : 0.0f;  // (0: the row sees no key)
      f[ri] = top[ri] == -INFINITY ? 0.0f : exp2_fast(m[ri] - top[ri]) * inv * fold;  // 2^(m − LSE) · fold
      fd[ri] = f[ri] * (d[ri] * inv);                                                  // f · D
    }
  }

  // dS = p · (dP · f − fd) into tSrdS, from p (sums: fp32; saved_sums: 16-bit) and dP.
  template <class FragP>
  __device__ void ds(const FragP& tSrS, const FragS16& tSrdP, bool is_cut, const float (&f)[kRows],
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
          const float p = value(s, ri, ci);
          const float x = value(dp, ri, ci);  // dP
          const float d = p * fmaf(x, f[ri], -fd[ri]);
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

  // The 32-bit pair of 16-bit values that holds dP(ri, ci): a row's values ci, ci + 1, ci even, are one pair
  // (Sm90Layouts.SoftmaxValueOrder), ci's in the low half.
  template <class DP>
  __device__ static uint32_t pair_bits(const DP& dp, int ri, int ci) {
    return reinterpret_cast<const uint32_t*>(&dp(ri, ci - ci % 2))[0];
  }

  // dP(ri, ci) (or P's) in fp32. In bf16 from the bits of its 32-bit pair (pair_bits): the high value by one AND,
  // where the conversion of the 16-bit value takes an extract and a shift.
  template <class DP>
  __device__ static float value(const DP& dp, int ri, int ci) {
    if constexpr (std::is_same_v<typename DP::value_type, float>) {
      return dp(ri, ci);
    } else if constexpr (std::is_same_v<Element, cutlass::bfloat16_t>) {
      const uint32_t bits = pair_bits(dp, ri, ci);
      return __uint_as_float(ci % 2 == 0 ? bits << 16 : bits & 0xffff0000u);
    } else {
      return float(dp(ri, ci));
    }
  }
};

}  // namespace qksoftmax::cuda::sm90
