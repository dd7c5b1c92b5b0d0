// The column pass's two-warpgroup step (StepTiles): the
// leader's TMA loads of K and of a step's (Q, dP[, P]) tiles, dS from the row statistics, and the dK epilogue.
#pragma once

#include <cutlass/arch/barrier.h>

#include "cuda/sm90_config.h"

namespace qksoftmax::cuda::sm90 {

using namespace cute;

// The steps of a CTA's key block in order, (query head of the group, row block), advanced without divisions:
// the row blocks from `first` (causal: the first that sees a key of the block) of each query head in turn.
struct StepCursor {
  int64_t head;
  int block;
  __device__ void advance(int first, int end) {
    if (++block == end) {
      block = first;
      ++head;
    }
  }
};

// K of key block nb of (b, kv_head) into st.k, completing on `full`.
template <class Cfg>
__device__ void load_k_tile(const typename Cfg::Loads& tma, const Problem& prob, typename Cfg::Tiles& st,
                            uint64_t& full, int64_t b, int64_t kv_head, int64_t nb) {
  using HD = typename Cfg::HD;
  cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&full, Cfg::kKBytes);
  Tensor sK = make_tensor(make_smem_ptr(st.k.data()), typename Cfg::SmemLayoutK{});  // (BN, D)
  Tensor mK = tma.k.get_tma_tensor(make_shape(int32_t(prob.Sk), HD{}, int32_t(prob.Hk), int32_t(prob.B)));
  Tensor gK = local_tile(mK(_, _, kv_head, b), Shape<typename Cfg::BN, HD>{}, make_coord(nb, 0));  // (BN, D)
  auto [tKgK, tKsK] = tma_partition(tma.k, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sK), group_modes<0, 2>(gK));
  copy(tma.k.with(full), tKgK, tKsK);
}

// The (Q, dP[, P]) tiles of query head h, row block mb, key block nb of batch b into `stage`, completing on `full`.
template <class Cfg>
__device__ void load_step_tiles(const typename Cfg::Loads& tma, const Problem& prob, typename Cfg::Tiles& st,
                                uint64_t& full, int stage, int64_t b, int64_t h, int64_t mb, int64_t nb) {
  using BM = typename Cfg::BM;
  using BN = typename Cfg::BN;
  using HD = typename Cfg::HD;
  cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&full, Cfg::kStageBytes);
  Tensor sQ = make_tensor(make_smem_ptr(st.q.data()), typename Cfg::SmemLayoutQ{});    // (BM, D, ST)
  Tensor sdP = make_tensor(make_smem_ptr(st.dp.data()), typename Cfg::SmemLayoutP{});  // (BM, BN, ST)
  Tensor sP = make_tensor(make_smem_ptr(st.p.data()), typename Cfg::SmemLayoutP{});    // (BM, BN, ST), saved-P
  const auto probs = make_shape(int32_t(prob.Sq), int32_t(prob.Sk), int32_t(prob.Hq), int32_t(prob.B));
  Tensor mQ = tma.q.get_tma_tensor(make_shape(int32_t(prob.Sq), HD{}, int32_t(prob.Hq), int32_t(prob.B)));
  Tensor gQ = local_tile(mQ(_, _, h, b), Shape<BM, HD>{}, make_coord(mb, 0));  // (BM, D)
  auto [tQgQ, tQsQ] = tma_partition(tma.q, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sQ(_, _, stage)), group_modes<0, 2>(gQ));
  copy(tma.q.with(full), tQgQ, tQsQ);
  Tensor gdP = local_tile(tma.dp.get_tma_tensor(probs)(_, _, h, b), Shape<BM, BN>{}, make_coord(mb, nb));  // (BM, BN)
  auto [tPgdP, tPsdP] = tma_partition(tma.dp, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sdP(_, _, stage)), group_modes<0, 2>(gdP));
  copy(tma.dp.with(full), tPgdP, tPsdP);
  if constexpr (Cfg::kSavedP) {
    Tensor gP = local_tile(tma.p.get_tma_tensor(probs)(_, _, h, b), Shape<BM, BN>{}, make_coord(mb, nb));  // (BM, BN)
    auto [tPgP, tPsP] = tma_partition(tma.p, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sP(_, _, stage)), group_modes<0, 2>(gP));
    copy(tma.p.with(full), tPgP, tPsP);
  }
}

// dS = P ∘ (dP − D) of this thread's share of the tile of rows from m0 and key columns from n0, rounded to 16
// bits, masked elements 0. P is the saved P (saved-P) or 2^(S·scale·log2e − LSE·log2e) (recompute; lse2 is the
// log2-domain LSE of the thread's rows). All tensors (rows, cols); tScS_rc gives each element's (r, c) in the
// tile. Only tiles that the mask or Sq cut pay for per-element compares.
template <class Cfg, class DS, class S, class P, class DP, class Coord, int kRows>
__device__ void softmax_backward(DS& tSrdS_rc, const S& tSrS_rc, const P& tSrP_rc, const DP& tSrdP_rc,
                                 const Coord& tScS_rc, const float (&lse2)[kRows], const float (&delta)[kRows],
                                 float scale_log2, const KeyRange& keys, int64_t m0, int64_t n0) {
  constexpr int kBlockN = Cfg::kBlockN;
  constexpr int kCols = size<1>(decltype(tScS_rc.layout()){});
  with_mask(keys.cuts(m0, Cfg::kBlockM, n0, kBlockN), [&](auto mask) {
    CUTE_UNROLL
    for (int ri = 0; ri < kRows; ++ri) {
      const int limit = mask ? keys.cols_in(m0 + get<0>(tScS_rc(ri, 0)), n0, kBlockN) : kBlockN;
      CUTE_UNROLL
      for (int ci = 0; ci < kCols; ++ci) {
        const float p = Cfg::kSavedP ? float(tSrP_rc(ri, ci)) : exp2_fast(tSrS_rc(ri, ci) * scale_log2 - lse2[ri]);
        const bool keep = !mask || get<1>(tScS_rc(ri, ci)) < limit;
        tSrdS_rc(ri, ci) = typename Cfg::Element(keep ? p * (float(tSrdP_rc(ri, ci)) - delta[ri]) : 0.0f);
      }
    }
  });
}

// dK = scale · Σ dSᵀ Q of key columns [n0, n0 + kBlockN) of (b, kv_head), from the accumulator of mma_dk:
// one row pointer per accumulator row of this thread (two), then 32-bit column offsets (on the GPU the last
// dimension has stride 1: validate.cpp).
template <class Cfg, class Acc>
__device__ void store_dk(const typename Cfg::MmadK& mma_dk, const Acc& tdKrdK, const Problem& prob, int64_t b,
                         int64_t kv_head, int64_t n0) {
  using Element = typename Cfg::Element;
  const Operand dk_op = prob.dk;
  const bool vector = aligned_rows<Element>(dk_op, 2);
  Tensor tdKcdK = mma_dk.get_thread_slice(threadIdx.x).partition_C(
      make_identity_tensor(Shape<typename Cfg::BN, typename Cfg::HD>{}));  // (MMA, MMA_N, MMA_D) → (c, d)
  Tensor tdKcdK_rc = make_tensor(tdKcdK.data(), rowcol(tdKcdK.layout()));  // (rows, cols) → (c, d)
  Tensor tdKrdK_rc = make_tensor(tdKrdK.data(), rowcol(tdKrdK.layout()));  // (rows, cols)
  Element* dk = static_cast<Element*>(dk_op.ptr) + dk_op.offset(b, kv_head, n0, 0);  // key column n0
  CUTE_UNROLL
  for (int ri = 0; ri < size<0>(tdKrdK_rc); ++ri) {
    const int c = get<0>(tdKcdK_rc(ri, 0));
    if (n0 + c >= prob.Sk) continue;
    Element* row = dk + c * dk_op.sr;
    CUTE_UNROLL
    for (int ci = 0; ci < size<1>(tdKrdK_rc); ci += 2) {  // an accumulator holds pairs of adjacent columns
      store_scaled(row + get<1>(tdKcdK_rc(ri, ci)), tdKrdK_rc(ri, ci), tdKrdK_rc(ri, ci + 1), prob.scale, vector);
    }
  }
}

}  // namespace qksoftmax::cuda::sm90
