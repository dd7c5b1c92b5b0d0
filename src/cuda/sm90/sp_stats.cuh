// The single pass's element-wise work (sp_mainloop.cuh): consumer w computes S = Q K_wᵀ, (64 rows, its 64 keys),
// with the rows on the products' M; a thread holds 2 rows × 16 keys of it and a row's 64 keys of the consumer lie
// in the 4 lanes of a quad, so that a row's maximum and sums take 2 shuffles each, a consumer writes one partial
// per row, and the combine reads the other consumer's partial alone and keeps its factors in registers.
//   ahead(S, stage, …) the statistics a step ahead: x = S·scale·log2e (−inf where the row does not see the key),
//                      the consumer's row maximum m, P_c = 2^(x − m) kept in fp16, dP read into registers,
//                      l = Σ P_c and u = Σ P_c · dP; (m, l, u) kept and written as the consumer's partial;
//   combine(g)         the two consumers' partials of step g: M = max m, L = Σ l 2^(m − M), U the same of u;
//                      f = 2^(m_own − M) / L (times |scale| where dS carries it) and f · D, D = U / L;
//   ds(dS, …)          dS = P_c · (dP · f − f · D), 0 where P_c is (masked), as the key-block step;
//   store_ds(dS, buf)  dS into the dS buffer by stmatrix, the dQ product's A operand and (transposed) dK's.
#pragma once

#include <cuda_fp16.h>

#include "cuda/sm90/sp_config.h"

namespace qksoftmax::cuda::sm90 {

template <class Cfg>
struct SpStats {
  using Element = typename Cfg::Element;
  using BM = typename Cfg::BM;
  using HD = typename Cfg::HD;
  using HF = typename Cfg::HF;
  using KB = typename Cfg::KB;
  static constexpr int kBlockM = Cfg::kBlockM, kHalf = Cfg::kHalf;
  using MmaS = typename Cfg::MmaS;
  using FragS = decltype(partition_fragment_C(MmaS{}, Shape<BM, HF>{}));  // (MMA, 1, 1) fp32
  using FragS16 = decltype(make_fragment_like<Element>(FragS{}));        // (MMA, 1, 1)
  using RowCol = decltype(rowcol(typename FragS::layout_type{}));         // (rows, keys)
  static constexpr int kRows = size<0>(RowCol{});
  static constexpr int kKeys = size<1>(RowCol{});
  static_assert(kRows == 2 && kKeys == 16, "a thread holds 2 rows × 16 keys of S, a row in a quad");
  static constexpr int kQuad = 4;

  const Problem& prob;
  typename Cfg::Storage& st;
  int w;    // this consumer
  int tid;  // within its warpgroup
  KeyRange keys;
  float scale_log2;
  float fold;  // what f carries beyond 2^(m_own − M) / L: |scale| where dS carries the scale

  MmaS mma_s;
  // P_c of the step against this consumer's row maxima, keys ci and ci + 1 of row ri in tSrPc[ri][ci / 2].
  __half2 tSrPc[kRows][kKeys / 2];
  FragS16 tSrdP;                                    // dP of the step
  float own_m[kRows], own_l[kRows], own_u[kRows];   // this consumer's partials of the step's rows
  float f[kRows], fd[kRows];                        // the step's factors (combine)

  // The (row, key) of each of this thread's values of S, within the consumer's (BM, HF) tile.
  __device__ auto coords() const {
    Tensor tScS = mma_s.get_thread_slice(tid).partition_C(make_identity_tensor(Shape<BM, HF>{}));  // (MMA, 1, 1)
    return make_tensor(tScS.data(), rowcol(tScS.layout()));                                     // (rows, keys)
  }

  // 32-bit shared-memory addresses of this thread's ldmatrix accesses of dP in stage 0 and stmatrix accesses of dS
  // in buffer 0, computed once (CuTe's copies recompute them in 64-bit arithmetic at every call); a stage or a
  // buffer is one (BM, BN) tile further.
  static constexpr uint32_t kTileBytes = uint32_t(Cfg::kBlockM * Cfg::kBlockN * sizeof(Element));
  static_assert(cosize_v<typename Cfg::SmemLayoutdS2> == 2 * Cfg::kBlockM * Cfg::kBlockN, "dS buffers are whole tiles");
  __device__ auto dp_addresses() const {
    Tensor sdP = make_tensor(make_smem_ptr(st.dp.data()), typename Cfg::SmemLayoutP{});  // (BM, BN, ST)
    const auto thr = typename Cfg::CopydP{}.get_thread_slice(tid);
    return matrix_addresses(thr.partition_S(Cfg::consumer_cols(sdP(_, _, 0), w)));
  }
  __device__ auto ds_addresses() const {
    Tensor sdS = make_tensor(make_smem_ptr(st.ds.data()), typename Cfg::SmemLayoutdS2{});  // (BM, BN, DB)
    const auto thr = typename Cfg::CopydS{}.get_thread_slice(tid);
    return matrix_addresses(thr.partition_D(Cfg::consumer_cols(sdS(_, _, 0), w)));
  }

  // S of the step in stage `stage` against K buffer kbuf into acc, one wgmma batch.
  __device__ void issue_s(int stage, int kbuf, FragS& acc) {
    auto thr = mma_s.get_thread_slice(tid);
    Tensor sQ = make_tensor(make_smem_ptr(st.q.data()), typename Cfg::SmemLayoutQ{});   // (BM, D, ST)
    Tensor sK = make_tensor(make_smem_ptr(st.k.data()), typename Cfg::SmemLayoutKB{});  // (BN, D, KB)
    const Tensor tSsQ = thr.partition_fragment_A(sQ);                                     // (MMA, 1, D/16, ST)
    const Tensor tSsK =
        thr.partition_fragment_B(local_tile(sK, Shape<HF, HD, KB>{}, make_coord(w, 0, 0)));  // (MMA, 1, D/16, KB)
    warpgroup_mma<size<2>(decltype(tSsQ.layout()){}), true, false>(mma_s, tSsQ(_, _, _, stage), tSsK(_, _, _, kbuf),
                                                                  acc);
  }

  // The statistics a step ahead, from S in tSrS (overwritten) and dP of stage `stage`: step g's P_c, dP and this
  // consumer's partials, kept and written (the caller's arrival on the statistics barrier announces them).
  template <class Addr>
  __device__ void ahead(FragS& tSrS, const Addr& dp_addr, int stage, int64_t m0, int64_t n0w, int g) {
    load_matrices(dp_addr, uint32_t(stage) * kTileBytes, typename Cfg::CopydP{}.get_thread_slice(tid).retile_D(tSrdP));
    Tensor tSrS_rc = make_tensor(tSrS.data(), RowCol{});   // (rows, keys)
    Tensor tSrdP_rc = make_tensor(tSrdP.data(), RowCol{});  // (rows, keys)
    const auto tScS_rc = coords();                          // (rows, keys) → (row, key)
    // x = s · k enters the exponent by one FFMA, 2^(s · k − m), and the maximum m = k · max s: with k = scale·log2e
    // where that is positive; otherwise S is scaled first and k = 1.
    const bool prescale = !(scale_log2 > 0.0f);
    if (prescale) {
      CUTE_UNROLL
      for (int i = 0; i < size(tSrS); ++i) tSrS(i) *= scale_log2;
    }
    const float k = prescale ? 1.0f : scale_log2;
    // s where the row sees the key, −inf elsewhere (KeyRange::cut's kinds).
    const auto masked = [&](auto kind, int diagonal) {
      constexpr BlockCut kCut = decltype(kind)::value;
      CUTE_UNROLL
      for (int ri = 0; ri < kRows; ++ri) {
        const int row = get<0>(tScS_rc(ri, 0));
        const int end = kCut == BlockCut::kRows ? keys.cols_in(m0 + row, n0w, kHalf) : kHalf;
        CUTE_UNROLL
        for (int ci = 0; ci < kKeys; ++ci) {
          const int key = get<1>(tScS_rc(ri, ci));
          const bool keep = kCut == BlockCut::kDiagonal ? key - row <= diagonal : key < end;
          tSrS_rc(ri, ci) = keep ? tSrS_rc(ri, ci) : -INFINITY;
        }
      }
    };
    const bool cut = keys.cuts(m0, kBlockM, n0w, kHalf);
    if (cut) {
      if (keys.sees_none(m0, kBlockM, n0w)) {
        fill(tSrS, -INFINITY);
      } else if (keys.diagonal_only(m0, kBlockM, n0w, kHalf)) {
        masked(std::integral_constant<BlockCut, BlockCut::kDiagonal>{}, int(m0 - n0w));
      } else {
        masked(std::integral_constant<BlockCut, BlockCut::kRows>{}, 0);
      }
    }
    // u = Σ P_c · dP over the keys the row sees: where the step is cut, a masked position (P_c = 0) adds 0
    // whatever dP holds there (NaN included).
    const auto partial = [&](auto is_cut) {
      CUTE_UNROLL
      for (int ri = 0; ri < kRows; ++ri) {
        float v[kKeys];
        CUTE_UNROLL
        for (int ci = 0; ci < kKeys; ++ci) v[ci] = tSrS_rc(ri, ci);
        const float m = quad_max<kQuad>(tree_reduce(v, MaxOp{})) * k;
        const float ref = m == -INFINITY ? 0.0f : m;  // a row that sees none of the consumer's keys: P_c = 0
        float p[kKeys], pdp[kKeys];
        CUTE_UNROLL
        for (int ci = 0; ci < kKeys; ++ci) {
          p[ci] = exp2_fast(fmaf(tSrS_rc(ri, ci), k, -ref));
          const float prod = p[ci] * float(tSrdP_rc(ri, ci));
          pdp[ci] = decltype(is_cut)::value ? (p[ci] > 0.0f ? prod : 0.0f) : prod;
        }
        CUTE_UNROLL
        for (int ci = 0; ci < kKeys; ci += 2) tSrPc[ri][ci / 2] = __floats2half2_rn(p[ci], p[ci + 1]);
        own_m[ri] = m;
        own_l[ri] = quad_sum<kQuad>(tree_reduce(p, SumOp{}));
        own_u[ri] = quad_sum<kQuad>(tree_reduce(pdp, SumOp{}));
      }
    };
    if (cut) {
      partial(std::true_type{});
    } else {
      partial(std::false_type{});
    }
    if (tid % kQuad == 0) {
      const int b = g % Cfg::kStatBuffers;
      CUTE_UNROLL
      for (int ri = 0; ri < kRows; ++ri) {
        store_shared_f4(smem_addr(&st.partials[b][w][get<0>(tScS_rc(ri, 0))]),
                        make_float4(own_m[ri], own_l[ri], own_u[ri], 0.0f));
      }
    }
  }

  // Step g's statistics (its partials awaited) into this thread's factors of its rows. Both consumers form L and U
  // by the same operations in the same order (a sum of two), so that they agree on them bit for bit.
  __device__ void combine(int g) {
    const auto tScS_rc = coords();  // (rows, keys) → (row, key)
    const int b = g % Cfg::kStatBuffers;
    CUTE_UNROLL
    for (int ri = 0; ri < kRows; ++ri) {
      const float4 other = load_shared_f4(smem_addr(&st.partials[b][1 - w][get<0>(tScS_rc(ri, 0))]));
      const float m = fmaxf(own_m[ri], other.x);
      const float ref = m == -INFINITY ? 0.0f : m;  // no key: L = 0
      const float c_own = exp2_fast(own_m[ri] - ref), c_other = exp2_fast(other.x - ref);
      const float l_own = own_l[ri] * c_own, l_other = other.y * c_other;
      const float u_own = own_u[ri] * c_own, u_other = other.z * c_other;
      const float l = w == 0 ? l_own + l_other : l_other + l_own;
      const float u = w == 0 ? u_own + u_other : u_other + u_own;
      const float inv = l > 0.0f ? rcp_fast(l) : 0.0f;
      f[ri] = c_own * inv * fold;
      fd[ri] = f[ri] * (u * inv);
    }
  }

  // dS of the step, its statistics combined.
  __device__ void ds(FragS16& tSrdS, int64_t m0, int64_t n0w) const {
    if (keys.cuts(m0, kBlockM, n0w, kHalf) && keys.sees_none(m0, kBlockM, n0w)) {
      fill(tSrdS, Element(0.0f));
      return;
    }
    const Tensor tSrdP_rc = make_tensor(tSrdP.data(), RowCol{});  // (rows, keys)
    Tensor tSrdS_rc = make_tensor(tSrdS.data(), RowCol{});         // (rows, keys)
    const auto elementwise = [&](auto is_cut) {
      CUTE_UNROLL
      for (int ri = 0; ri < kRows; ++ri) {
        CUTE_UNROLL
        for (int ci = 0; ci < kKeys; ci += 2) {
          const float2 p = __half22float2(tSrPc[ri][ci / 2]);
          const float ds0 = p.x * fmaf(float(tSrdP_rc(ri, ci)), f[ri], -fd[ri]);
          const float ds1 = p.y * fmaf(float(tSrdP_rc(ri, ci + 1)), f[ri], -fd[ri]);
          tSrdS_rc(ri, ci) = Element(decltype(is_cut)::value && p.x == 0.0f ? 0.0f : ds0);
          tSrdS_rc(ri, ci + 1) = Element(decltype(is_cut)::value && p.y == 0.0f ? 0.0f : ds1);
        }
      }
    };
    if (keys.cuts(m0, kBlockM, n0w, kHalf)) {
      elementwise(std::true_type{});
    } else {
      elementwise(std::false_type{});
    }
  }

  // dS into this consumer's keys of dS buffer `buf` ((BM, BN) K-major: the dQ product's A operand, and through
  // its transposed view dK's).
  template <class Addr>
  __device__ void store_ds(const FragS16& tSrdS, const Addr& ds_addr, int buf) const {
    store_matrices(ds_addr, uint32_t(buf) * kTileBytes, typename Cfg::CopydS{}.get_thread_slice(tid).retile_S(tSrdS));
  }
};

}  // namespace qksoftmax::cuda::sm90
