// The pingpong single pass's element-wise work (sp_pp_mainloop.cuh): a consumer holds S = Q Kᵀ of its block,
// (64 rows, the CTA's 128 keys from n0), a thread 2 rows × 32 keys, a row's keys in the 4 lanes of a quad, so that a
// row's sums over the CTA's keys are the warpgroup's own, 2 shuffles per reduction. For each row, over the
// keys it sees:
//   x = S·scale·log2e (one FFMA inside the exponent), m = max x, p = 2^(x − m), l = Σ p, u = Σ p · dP;
//   one CTA: f = fold / l, fd = f · u / l (D = u / l); in a cluster, with the other CTAs' statistics
//   (sp_pp_exchange.cuh): f = fold · 2^(m − LSE), fd = f · D;
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

  // The block of rows [m0, m0 + 64) against the CTA's keys (from n0): every row sees every key (compiled without
  // the compares); some row does not see some key (the element-wise code masks). With kSm90SpHalfDiagonal, cut
  // blocks by halves of the keys (a thread's values ci < kKeys / 2 of a row in RowCol are the first 64 keys:
  // columns 8c + 2·(lane mod 4) + v of chunks c < 8): no row sees the second 64 (a causal key block's first row
  // block, keys past Sk), so the work runs over the first 64 alone, p and dS 0 past them (kHalfDiagonalFirst); every
  // row sees the first 64 (a causal key block's second row block), so only the second 64 are compared
  // (kHalfDiagonalBoth).
  enum class Cut { kNone, kSome, kFirstHalf, kSecondHalf };
  __device__ Cut cut(int64_t m0, int64_t n0) const {
    if (!keys.cuts(m0, Cfg::kBlockM, n0, Cfg::kBlockN)) return Cut::kNone;
    if constexpr (kSm90SpHalfDiagonal >= kHalfDiagonalFirst) {
      if (keys.sees_none(m0, Cfg::kBlockM, n0 + Cfg::kBlockN / 2)) return Cut::kFirstHalf;
    }
    if constexpr (kSm90SpHalfDiagonal >= kHalfDiagonalBoth) {
      if (!keys.cuts(m0, Cfg::kBlockM, n0, Cfg::kBlockN / 2)) return Cut::kSecondHalf;
    }
    return Cut::kSome;
  }
  // f(cut_from, live) for the block's kind: values ci ≥ cut_from of a row are compared with the row's end, values
  // ci ≥ live are not computed (Int constants). A kind this build does not take is masked whole.
  template <class F>
  __device__ static void with_cut(Cut block_cut, F&& f) {
    if (block_cut == Cut::kNone) return f(Int<kKeys>{}, Int<kKeys>{});
    if constexpr (kSm90SpHalfDiagonal >= kHalfDiagonalFirst) {
      if (block_cut == Cut::kFirstHalf) return f(Int<0>{}, Int<kKeys / 2>{});
    }
    if constexpr (kSm90SpHalfDiagonal >= kHalfDiagonalBoth) {
      if (block_cut == Cut::kSecondHalf) return f(Int<kKeys / 2>{}, Int<kKeys>{});
    }
    f(Int<0>{}, Int<kKeys>{});
  }

  // The sums of the block's rows over the CTA's keys: S (overwritten) into p, masked, and each row's m (0 where the
  // row sees none of the keys), l and u (of every lane of its quad).
  __device__ void sums(FragS& tSrS, const FragS16& tSrdP, int64_t m0, int64_t n0, Cut block_cut,
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
    with_cut(block_cut, [&](auto cut_from, auto live_keys) {
      constexpr int kCutFrom = decltype(cut_from)::value;  // a row's values from which the keys are compared
      constexpr int kLive = decltype(live_keys)::value;    // a row's values of the thread that any row may see
      // −inf where the row does not see the key (causal, keys past Sk, rows past Sq)
      if constexpr (kCutFrom < kLive) {
        const auto rc = coords();  // (rows, keys) → (row, key)
        CUTE_UNROLL
        for (int ri = 0; ri < kRows; ++ri) {
          const int64_t row = m0 + get<0>(rc(ri, 0));
          const int end = keys.cols_in(row, n0, Cfg::kBlockN);
          CUTE_UNROLL
          for (int ci = kCutFrom; ci < kLive; ++ci) s(ri, ci) = get<1>(rc(ri, ci)) < end ? s(ri, ci) : -INFINITY;
        }
      }
      // Both rows at each stage, so that their dependency chains (trees, shuffles) overlap.
      float ref[kRows];
      CUTE_UNROLL
      for (int ri = 0; ri < kRows; ++ri) {
        float v[kLive];
        CUTE_UNROLL
        for (int ci = 0; ci < kLive; ++ci) v[ci] = s(ri, ci);
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
      for (int ci = 0; ci < kLive; ++ci) {
        CUTE_UNROLL
        for (int ri = 0; ri < kRows; ++ri) {
          const float p = exp2_fast(fmaf(s(ri, ci), k, -ref[ri]));
          s(ri, ci) = p;
          l[ri][ci % kSums] += p;
          // A masked key (p = 0) adds nothing whatever dP holds there (NaN included).
          const float d = ci >= kCutFrom && p == 0.0f ? 0.0f : float(dp(ri, ci));
          u[ri][ci % kSums] = fmaf(p, d, u[ri][ci % kSums]);
        }
      }
      CUTE_UNROLL
      for (int ri = 0; ri < kRows; ++ri) {
        m_out[ri] = ref[ri];
        l_out[ri] = tree_reduce(l[ri], SumOp{});
        u_out[ri] = tree_reduce(u[ri], SumOp{});
      }
    });
    quad_sum_rows<kQuad>(l_out, u_out);
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

  // dS = p · (dP · f − fd) into tSrdS, from p (stats) and dP.
  __device__ void ds(const FragS& tSrS, const FragS16& tSrdP, Cut block_cut, const float (&f)[kRows],
                     const float (&fd)[kRows], FragS16& tSrdS) const {
    const Tensor s = make_tensor(tSrS.data(), RowCol{});    // (rows, keys)
    const Tensor dp = make_tensor(tSrdP.data(), RowCol{});  // (rows, keys)
    Tensor ds = make_tensor(tSrdS.data(), RowCol{});        // (rows, keys)
    const auto elementwise = [&](auto cut_from, auto live_keys) {
      constexpr int kCutFrom = decltype(cut_from)::value;
      constexpr int kLive = decltype(live_keys)::value;
      CUTE_UNROLL
      for (int ri = 0; ri < kRows; ++ri) {
        CUTE_UNROLL
        for (int ci = 0; ci < kKeys; ++ci) {
          if (ci >= kLive) {
            ds(ri, ci) = Element(0.0f);
            continue;
          }
          const float p = s(ri, ci);
          float x;  // dP
          if constexpr (kSm90SpDsForm >= kDsWidenAgain) {
            x = widened(dp, ri, ci);
          } else {
            x = float(dp(ri, ci));
          }
          const float d = p * fmaf(x, f[ri], -fd[ri]);
          ds(ri, ci) = Element(ci >= kCutFrom && p == 0.0f ? 0.0f : d);
        }
      }
    };
    with_cut(block_cut, [&](auto cut_from, auto live_keys) {
      if constexpr (kSm90SpDsForm == kDsPacked && decltype(cut_from)::value == kKeys) {
        packed(s, dp, f, fd, ds);
      } else {
        elementwise(cut_from, live_keys);
      }
    });
  }

  // kDsWidenAgain: dP(ri, ci) widened to fp32 in a form of its own (inline PTX on its 32-bit pair), so
  // that the compiler converts it again here instead of keeping the statistics' 64 fp32 values of dP live through the
  // exchange (32 registers of the consumers' peak).
  template <class DP>
  __device__ static float widened(const DP& dp, int ri, int ci) {
    const uint32_t bits = reinterpret_cast<const uint32_t*>(&dp(ri, ci - ci % 2))[0];
    float y;
    if constexpr (std::is_same_v<Element, cutlass::bfloat16_t>) {
      if (ci % 2 == 0) {
        asm volatile("prmt.b32 %0, %1, 0, 0x1044;" : "=f"(y) : "r"(bits));
      } else {
        asm volatile("and.b32 %0, %1, 0xffff0000;" : "=f"(y) : "r"(bits));
      }
    } else if (ci % 2 == 0) {
      asm volatile("{ .reg .f16 lo, hi; mov.b32 {lo, hi}, %1; cvt.f32.f16 %0, lo; }" : "=f"(y) : "r"(bits));
    } else {
      asm volatile("{ .reg .f16 lo, hi; mov.b32 {lo, hi}, %1; cvt.f32.f16 %0, hi; }" : "=f"(y) : "r"(bits));
    }
    return y;
  }

  // kDsPacked, a block without masked keys: dS in 16-bit pairs, the bracket dP · f − fd by one
  // fma.rn of the pair (f and fd rounded to 16 bits), p rounded to 16 bits beside it, their product by one mul.rn:
  // 3 instructions a pair instead of 5. The bracket's error is then ~2^-9 (bf16) of |dP · f| + |fd|, not of the
  // bracket: where dP ≈ D, dS can be off by its own size (rare values; the Frobenius error of dQ and dK is what the
  // A/B measures), and in fp16 a tiny f (2^(m − LSE) / l) loses bits as a subnormal. A row's values (ci, ci + 1), ci
  // even, are one 32-bit pair of the 16-bit fragments (Sm90Layouts.SoftmaxValueOrder).
  using Pair = std::conditional_t<std::is_same_v<Element, cutlass::bfloat16_t>, __nv_bfloat162, __half2>;
  template <class S, class DP, class DS>
  __device__ static void packed(const S& s, const DP& dp, const float (&f)[kRows], const float (&fd)[kRows], DS& ds) {
    CUTE_UNROLL
    for (int ri = 0; ri < kRows; ++ri) {
      const Pair f2 = pair(f[ri], f[ri]), nfd2 = pair(-fd[ri], -fd[ri]);
      CUTE_UNROLL
      for (int ci = 0; ci < kKeys; ci += 2) {
        const Pair dp2 = reinterpret_cast<const Pair*>(&dp(ri, ci))[0];
        reinterpret_cast<Pair*>(&ds(ri, ci))[0] = __hmul2(pair(s(ri, ci), s(ri, ci + 1)), __hfma2(dp2, f2, nfd2));
      }
    }
  }
  __device__ static Pair pair(float lo, float hi) {
    if constexpr (std::is_same_v<Element, cutlass::bfloat16_t>) {
      return __floats2bfloat162_rn(lo, hi);
    } else {
      return __floats2half2_rn(lo, hi);
    }
  }
};

}  // namespace qksoftmax::cuda::sm90
