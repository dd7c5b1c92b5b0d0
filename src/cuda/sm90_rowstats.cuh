// Hopper backward, row statistics: one CTA (two warpgroups of 64 rows, two CTAs per SM) per (b, h, 128-row
// block) walks the live 64-column blocks of its rows, K, dP (and P) tiles arriving by TMA (two stages), and
// produces per row
//   recompute:            LSE (online max/sum of S = scale·QKᵀ, wgmma) and D = Σ_j P_ij dP_ij
//   recompute, LSE given: D = Σ_j exp(S_ij − LSE_i) dP_ij
//   saved-P:              D = Σ_j P_ij dP_ij (no product)
// The four lanes of a quad share the rows of a wgmma accumulator: row sums end in quad shuffles.
// It also clears its rows of what the key-block pass adds dQ into, the fp32 accumulator or dQ itself (a pass of
// its own, a memset, cost more: measured in docs/PERFORMANCE.md, v7c), and CTA 0 sets the key-block pass's tile
// counter to 0 (sm90/kb_scheduler.h), the pass that follows on the stream seeing it as it sees the cleared dQ.
#pragma once

#include <cutlass/arch/barrier.h>

#include "cuda/sm90_config.h"

namespace qksoftmax::cuda::sm90 {

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocksPerSm)
    rowstats_kernel(CUTE_GRID_CONSTANT const typename Cfg::Params params) {
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  using BM = typename Cfg::BM;
  using BN = typename Cfg::BN;
  using HD = typename Cfg::HD;
  constexpr int kBlockN = Cfg::kBlockN, kQuad = Cfg::kQuad;
  extern __shared__ __align__(128) char smem_raw[];
  auto& st = *reinterpret_cast<typename Cfg::RowStatsStorage*>(smem_raw);

  const Problem& prob = params.prob;
  const bool saved_p = prob.mode == BackwardMode::kSavedP;
  const bool need_scores = !saved_p;
  const bool online = need_scores && !params.lse_given;
  const generic::TileCoord tile = generic::row_tile<Cfg>(prob);
  const int64_t b = tile.b, h = tile.h, m0 = tile.tile;
  const int64_t kv_head = h / prob.group();
  const int64_t steps = generic::col_blocks_for_rows<Cfg>(prob, m0);
  const bool leader = threadIdx.x == 0;
  if (leader && blockIdx.x == 0) *params.kb_tile_counter = 0;

  Tensor sQ = make_tensor(make_smem_ptr(st.scores.q.data()), typename Cfg::SmemLayoutQ{});  // (BM, D), recompute
  Tensor sK = make_tensor(make_smem_ptr(st.scores.k.data()), typename Cfg::SmemLayoutK{});  // (BN, D, ST), recompute
  Tensor sdP = make_tensor(make_smem_ptr(st.dp.data()), typename Cfg::SmemLayoutP{});      // (BM, BN, ST)
  Tensor sP = make_tensor(make_smem_ptr(st.p.data()), typename Cfg::SmemLayoutP{});        // (BM, BN, ST), saved-P

  Tensor mQ = params.tma_q.get_tma_tensor(make_shape(int32_t(prob.Sq), HD{}, int32_t(prob.Hq), int32_t(prob.B)));
  Tensor mK = params.tma_k.get_tma_tensor(make_shape(int32_t(prob.Sk), HD{}, int32_t(prob.Hk), int32_t(prob.B)));
  Tensor mdP = params.tma_dp.get_tma_tensor(make_shape(int32_t(prob.Sq), int32_t(prob.Sk), int32_t(prob.Hq), int32_t(prob.B)));
  Tensor mP = params.tma_p.get_tma_tensor(make_shape(int32_t(prob.Sq), int32_t(prob.Sk), int32_t(prob.Hq), int32_t(prob.B)));
  const int64_t mb = m0 / Cfg::kBlockM;

  if (leader) {
    for (int s = 0; s < Cfg::kStages; ++s) Barrier::init(&st.stage_full[s], 1);
    Barrier::init(&st.q_full, 1);
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  const auto issue_step = [&](int64_t t) {
    const int stage = int(t % Cfg::kStages);
    Barrier::arrive_and_expect_tx(&st.stage_full[stage], (need_scores ? Cfg::kKBytes : 0) +
                                                             Cfg::kPBytes * (saved_p ? 2 : 1));
    if (need_scores) {
      Tensor gK = local_tile(mK(_, _, kv_head, b), Shape<BN, HD>{}, make_coord(t, 0));  // (BN, D)
      tma_load_tile(params.tma_k, st.stage_full[stage], gK, sK(_, _, stage));
    }
    Tensor gdP = local_tile(mdP(_, _, h, b), Shape<BM, BN>{}, make_coord(mb, t));  // (BM, BN)
    tma_load_tile(params.tma_dp, st.stage_full[stage], gdP, sdP(_, _, stage));
    if (saved_p) {
      Tensor gP = local_tile(mP(_, _, h, b), Shape<BM, BN>{}, make_coord(mb, t));
      tma_load_tile(params.tma_p, st.stage_full[stage], gP, sP(_, _, stage));
    }
  };

  if (leader) {
    if (need_scores) {
      Barrier::arrive_and_expect_tx(&st.q_full, Cfg::kQBytes);
      Tensor gQ = local_tile(mQ(_, _, h, b), Shape<BM, HD>{}, make_coord(mb, 0));  // (BM, D)
      tma_load_tile(params.tma_q, st.q_full, gQ, sQ);
    }
    if (steps > 0) issue_step(0);
  }

  typename Cfg::MmaS mma_s;
  auto thr_s = mma_s.get_thread_slice(threadIdx.x);
  Tensor tScS = thr_s.partition_C(make_identity_tensor(Shape<BM, BN>{}));  // (MMA, MMA_M, MMA_N) → (r, c)
  Tensor tScS_rc = make_tensor(tScS.data(), rowcol(tScS.layout()));         // (rows, cols) → (r, c)
  constexpr int kRows = size<0>(decltype(tScS_rc.layout()){});
  constexpr int kCols = size<1>(decltype(tScS_rc.layout()){});
  // dP and P tiles into the accumulator's layout by ldmatrix (one instruction per 8 × 8 block of a warp).
  auto s2r = make_tiled_copy_C(Copy_Atom<SM75_U32x4_LDSM_N, typename Cfg::Element>{}, mma_s);
  auto thr_s2r = s2r.get_thread_slice(threadIdx.x);
  const auto dp_addr = matrix_addresses(thr_s2r.partition_S(sdP(_, _, 0)));  // (A, CPY_M, CPY_N), stage 0
  const auto p_addr = matrix_addresses(thr_s2r.partition_S(sP(_, _, 0)));    // (A, CPY_M, CPY_N), stage 0

  // Running statistics of this thread's rows (identical across its quad), in the log2 domain:
  // max of S·scale·log2e, Σ 2^(S' − max), Σ 2^(S' − max)·dP; with the LSE given or in saved-P mode only the dot.
  constexpr float kLn2 = 0.6931471805599453f;
  const float scale_log2 = prob.scale * kLog2e;
  const KeyRange keys = prob.keys();
  float row_max[kRows], row_sum[kRows], row_dot[kRows], row_lse2[kRows];
  CUTE_UNROLL
  for (int ri = 0; ri < kRows; ++ri) {
    const int64_t row = m0 + get<0>(tScS_rc(ri, 0));
    row_lse2[ri] = params.lse_given && row < prob.Sq ? params.lse.ptr[params.lse.offset(b, h, row)] * kLog2e : 0.0f;
    row_max[ri] = -INFINITY;
    row_sum[ri] = 0.0f;
    row_dot[ri] = 0.0f;
  }
  if (need_scores) Barrier::wait(&st.q_full, 0);

  // The step's stage and the phase of its barrier, carried rather than divided out of t (64-bit divisions
  // were 30 instructions per warp and step).
  int stage = 0;
  uint32_t phase = 0;
  for (int64_t t = 0; t < steps; ++t) {
    if (leader && t + 1 < steps) issue_step(t + 1);
    Barrier::wait(&st.stage_full[stage], phase);
    const int64_t n0 = t * kBlockN;

    Tensor tSrS = partition_fragment_C(mma_s, Shape<BM, BN>{});  // (MMA, MMA_M, MMA_N) fp32
    Tensor tSrdP = make_fragment_like<typename Cfg::Element>(tSrS);                         // (MMA, MMA_M, MMA_N)
    const uint32_t stage_offset = uint32_t(stage) * Cfg::kPBytes;  // stages are whole swizzle periods apart
    load_matrices(dp_addr, stage_offset, thr_s2r.retile_D(tSrdP));
    Tensor tSrP = make_fragment_like<typename Cfg::Element>(tSrS);                          // (MMA, MMA_M, MMA_N)
    if (saved_p) load_matrices(p_addr, stage_offset, thr_s2r.retile_D(tSrP));
    if (need_scores) warpgroup_gemm<true>(mma_s, sQ, sK(_, _, stage), tSrS);
    Tensor tSrS_rc = make_tensor(tSrS.data(), rowcol(tSrS.layout()));                       // (rows, cols)
    Tensor tSrdP_rc = make_tensor(tSrdP.data(), rowcol(tSrdP.layout()));                   // (rows, cols)
    Tensor tSrP_rc = make_tensor(tSrP.data(), rowcol(tSrP.layout()));                      // (rows, cols)

    // Only the tiles that the mask or the last row cuts pay for per-element compares, one per element where the
    // causal diagonal alone cuts the tile (column − row ≤ m0 − n0 there, clamped to [−kBlockM, kBlockM]).
    const int diagonal = int(cute::max(cute::min(m0 - n0, int64_t(Cfg::kBlockM)), int64_t(-Cfg::kBlockM)));
    with_cut(keys.cut(m0, Cfg::kBlockM, n0, kBlockN), [&](auto kind) {
      constexpr BlockCut kCut = decltype(kind)::value;
      CUTE_UNROLL
      for (int ri = 0; ri < kRows; ++ri) {
        const int r = get<0>(tScS_rc(ri, 0));
        const int limit = kCut == BlockCut::kRows ? keys.cols_in(m0 + r, n0, kBlockN) : kBlockN;
        const auto keep = [&](int ci) {
          const int c = get<1>(tScS_rc(ri, ci));
          return kCut == BlockCut::kNone ? true : kCut == BlockCut::kDiagonal ? c - r <= diagonal : c < limit;
        };
        float v[kCols], w[kCols];  // this thread's terms of the row, reduced as trees
        if (!online) {  // P is known (saved, or from the given LSE): D accumulates directly
          CUTE_UNROLL
          for (int ci = 0; ci < kCols; ++ci) {
            const float p = saved_p ? float(tSrP_rc(ri, ci)) : exp2_fast(tSrS_rc(ri, ci) * scale_log2 - row_lse2[ri]);
            w[ci] = keep(ci) ? p * float(tSrdP_rc(ri, ci)) : 0.0f;
          }
          row_dot[ri] += quad_sum<kQuad>(tree_reduce(w, SumOp{}));
          continue;
        }
        CUTE_UNROLL
        for (int ci = 0; ci < kCols; ++ci) v[ci] = keep(ci) ? tSrS_rc(ri, ci) * scale_log2 : -INFINITY;
        const float new_max = fmaxf(row_max[ri], quad_max<kQuad>(tree_reduce(v, MaxOp{})));
        const float base = new_max == -INFINITY ? 0.0f : new_max;  // nothing live yet: the sums stay 0
        CUTE_UNROLL
        for (int ci = 0; ci < kCols; ++ci) {
          v[ci] = keep(ci) ? exp2_fast(tSrS_rc(ri, ci) * scale_log2 - base) : 0.0f;
          w[ci] = keep(ci) ? v[ci] * float(tSrdP_rc(ri, ci)) : 0.0f;  // masked dP: never used
        }
        const float rescale = exp2_fast(row_max[ri] - base);
        row_sum[ri] = row_sum[ri] * rescale + quad_sum<kQuad>(tree_reduce(v, SumOp{}));
        row_dot[ri] = row_dot[ri] * rescale + quad_sum<kQuad>(tree_reduce(w, SumOp{}));
        row_max[ri] = new_max;
      }
    });
    __syncthreads();  // the stage is free for the next TMA
    if (++stage == Cfg::kStages) {
      stage = 0;
      phase ^= 1;
    }
  }

  // The dQ rows of this block, cleared after the loop (no fence of the loop waits for the stores).
  const int rows = int(min(int64_t(Cfg::kBlockM), prob.Sq - m0));
  const DqTarget& clear = params.dq_clear;
  for (int i = threadIdx.x; i < rows * clear.row_vectors; i += Cfg::kThreads) {
    clear.row(b, h, m0 + i / clear.row_vectors)[i % clear.row_vectors] = make_uint4(0, 0, 0, 0);
  }

  if (threadIdx.x % kQuad != 0) return;
  CUTE_UNROLL
  for (int ri = 0; ri < kRows; ++ri) {
    const int64_t row = m0 + get<0>(tScS_rc(ri, 0));
    if (row >= prob.Sq) continue;
    if (online) {
      const bool any = row_sum[ri] > 0.0f;
      params.lse.ptr[params.lse.offset(b, h, row)] = any ? (row_max[ri] + log2f(row_sum[ri])) * kLn2 : -INFINITY;
      params.delta.ptr[params.delta.offset(b, h, row)] = any ? row_dot[ri] / row_sum[ri] : 0.0f;
    } else {
      params.delta.ptr[params.delta.offset(b, h, row)] = row_dot[ri];
    }
  }
}

}  // namespace qksoftmax::cuda::sm90
