// Hopper backward, column pass (FlashAttention-3's backward shape, statistics given): one CTA of two
// warpgroups owns a 128-column block of a key head; K and the dK accumulator stay on chip while the row blocks
// of every query head of its group stream through shared memory by TMA. Per 64-row block t:
//   recompute: S = Q Kᵀ (wgmma), P = 2^(S·scale·log2e − LSE·log2e);  saved-P: P tile
//   dS = P ∘ (dP − D) → shared memory (16-bit, stmatrix)
//   dK += dSᵀ Q (wgmma, registers)
//   dQ partial = dS K (wgmma) → shared memory → one TMA reduce-add: fp32 into the accumulator, or (kDirectDq)
//   scaled and rounded to 16 bits into dQ itself
// LSE and D come from the row statistics (sm90_rowstats.cuh), which also clear what dQ is added into;
// convert_dq_kernel scales and converts the accumulator.
// The warpgroups split the 128 columns for S and dK and the head dimensions for dQ. Thread 0 issues the TMA
// loads and the reduce-adds. The tensor cores work under the element-wise dS: S of step t + 1 is issued
// before dS of step t is computed, and dK of step t completes during step t + 1 (waited for only before dS
// of step t + 1 overwrites the dS it reads). Needs TMA-ready tensors; not deterministic (the adds of different
// CTAs land in any order).
#pragma once

#include <cutlass/arch/barrier.h>

#include <type_traits>

#include "cuda/sm90_config.h"
#include "cuda/sm90_step.cuh"

namespace qksoftmax::cuda::sm90 {

using namespace cute;

// (Q, dP[, P]) stages: a stage is released one step after its own (dK reads Q until then), so recompute
// keeps four and saved-P, whose stage is half as large again, three. One dQ staging buffer: the reduce-add
// issued at the end of step t − 1 must have read it by the first barrier of step t (S issued, dS computed),
// where the leader waits for it.
// kDirectDq: each partial is scaled, rounded to 16 bits and added into dQ itself (half the bytes of the fp32
// partial, no accumulator, no conversion pass), for rows of few enough column blocks that the 16-bit sums stay
// within the accuracy bar (kSm90DirectDqMaxSk).
template <class Element_, int kHeadDim_, bool kSavedP_, bool kDirectDq_>
struct ColPassConfig : StepTiles<Element_, kHeadDim_, kSavedP_, kSavedP_ ? 3 : 4> {
  using Base = StepTiles<Element_, kHeadDim_, kSavedP_, kSavedP_ ? 3 : 4>;
  using Element = Element_;
  using typename Base::BM;
  using typename Base::HD;
  static constexpr bool kDirectDq = kDirectDq_;
  using DqElement = std::conditional_t<kDirectDq, Element, float>;  // what a dQ partial is added as

  // dQ partials, 128-byte swizzled (rows 8 apart in different banks) as TMA reads them.
  using SmemLayoutdQ = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<DqElement>{}, Shape<BM, HD>{}));  // (rows, d)

  // What the partials are reduce-added into, (rows, d, head, batch): the fp32 accumulator (contiguous) or dQ.
  using TmadQ = decltype(make_tma_copy(
      SM90_TMA_REDUCE_ADD{},
      make_tensor(make_gmem_ptr(static_cast<DqElement*>(nullptr)), Shape<int32_t, HD, int32_t, int32_t>{},
                  Stride<int64_t, _1, int64_t, int64_t>{}),
      SmemLayoutdQ{}));

  struct Storage : Base::Tiles {
    alignas(1024) cute::array<DqElement, cosize_v<SmemLayoutdQ>> dq;
    alignas(8) uint64_t stage_full[Base::kStages];
    alignas(8) uint64_t k_full;
  };
  static constexpr int kSmemBytes = int(sizeof(Storage));
  static_assert(kSmemBytes <= 227 * 1024, "the column pass's shared memory exceeds a CTA's 227 KB");

  // Element offset of (row, d) in the dQ buffer, the swizzle in element units (SmemLayoutdQ's own swizzle acts
  // on byte addresses: applied to an element index it would move the wrong bits).
  CUTE_HOST_DEVICE static int dq_offset(int row, int d) {
    return as_position_independent_swizzle_layout(SmemLayoutdQ{})(row, d);
  }

  struct Params {
    Problem prob;
    typename Base::Loads tma;
    TmadQ tma_dq;
    generic::RowVec lse;    // recompute: log-sum-exp of each row
    generic::RowVec delta;  // D of each row
  };
};

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    colpass_kernel(CUTE_GRID_CONSTANT const typename Cfg::Params params) {
  using Element = typename Cfg::Element;
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  using BM = typename Cfg::BM;
  using BN = typename Cfg::BN;
  using HD = typename Cfg::HD;
  constexpr bool kSavedP = Cfg::kSavedP;
  constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN, kStages = Cfg::kStages;
  extern __shared__ __align__(128) char smem_raw[];
  auto& st = *reinterpret_cast<typename Cfg::Storage*>(smem_raw);

  const Problem& prob = params.prob;
  const int64_t Sq = prob.Sq, group = prob.group();
  const KeyRange keys = prob.keys();
  const int64_t col_blocks = (prob.Sk + kBlockN - 1) / kBlockN;
  const generic::TileCoord tile = generic::tile_coord(col_blocks, prob.Hk);
  const int64_t b = tile.b, kv_head = tile.h, nb = tile.tile, n0 = nb * kBlockN;
  const int row_blocks = int((Sq + kBlockM - 1) / kBlockM);
  // Causal: the row blocks above this column block see none of it.
  const int first_row_block = min(keys.causal ? int(n0 / kBlockM) : 0, row_blocks);
  const int steps_per_head = row_blocks - first_row_block;
  const int steps = steps_per_head * int(group);  // (query head of the group, row block); fits 32 bits
  const int tid = threadIdx.x;
  const bool leader = tid == 0;
  const float scale_log2 = prob.scale * kLog2e;

  // One cursor for the consumers' step, one for the leader's next load.
  StepCursor step_at{kv_head * group, first_row_block}, load_at = step_at;

  Tensor sQ = make_tensor(make_smem_ptr(st.q.data()), typename Cfg::SmemLayoutQ{});       // (BM, D, ST)
  Tensor sQt = make_tensor(make_smem_ptr(st.q.data()), typename Cfg::SmemLayoutQt{});     // (D, BM, ST)
  Tensor sK = make_tensor(make_smem_ptr(st.k.data()), typename Cfg::SmemLayoutK{});       // (BN, D)
  Tensor sKt = make_tensor(make_smem_ptr(st.k.data()), typename Cfg::SmemLayoutKt{});     // (D, BN)
  Tensor sdP = make_tensor(make_smem_ptr(st.dp.data()), typename Cfg::SmemLayoutP{});     // (BM, BN, ST)
  Tensor sP = make_tensor(make_smem_ptr(st.p.data()), typename Cfg::SmemLayoutP{});       // (BM, BN, ST), saved-P
  Tensor sdS = make_tensor(make_smem_ptr(st.ds.data()), typename Cfg::SmemLayoutdS{});    // (BM, BN)
  Tensor sdSt = make_tensor(make_smem_ptr(st.ds.data()), typename Cfg::SmemLayoutdSt{});  // (BN, BM)
  Tensor sdQ = make_tensor(make_smem_ptr(st.dq.data()), typename Cfg::SmemLayoutdQ{});    // (BM, D) DqElement

  Tensor mdQ = params.tma_dq.get_tma_tensor(make_shape(int32_t(Sq), HD{}, int32_t(prob.Hq), int32_t(prob.B)));

  if (leader) {
    for (int s = 0; s < kStages; ++s) Barrier::init(&st.stage_full[s], 1);
    Barrier::init(&st.k_full, 1);
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  // The leader's loads of step t (the step after the previous call's) into stage t % kStages.
  const auto load_step = [&](int t) {
    const int stage = t % kStages;
    const int64_t h = load_at.head, mb = load_at.block;
    load_at.advance(first_row_block, row_blocks);
    load_step_tiles<Cfg>(params.tma, prob, st, st.stage_full[stage], stage, b, h, mb, nb);
  };
  const auto stage_wait = [&](int t) { Barrier::wait(&st.stage_full[t % kStages], uint32_t((t / kStages) & 1)); };

  if (leader && steps > 0) {  // (a CTA without steps must not exit with a load writing its shared memory)
    load_k_tile<Cfg>(params.tma, prob, st, st.k_full, b, kv_head, nb);
    for (int t = 0; t < min(steps, kStages); ++t) load_step(t);
  }

  typename Cfg::MmaS mma_s;
  typename Cfg::MmadQ mma_dq;
  typename Cfg::MmadK mma_dk;
  auto thr_s = mma_s.get_thread_slice(tid);
  auto thr_dq = mma_dq.get_thread_slice(tid);
  Tensor tSrS = partition_fragment_C(mma_s, Shape<BM, BN>{});     // (MMA, MMA_M, MMA_N) fp32
  Tensor tdKrdK = partition_fragment_C(mma_dk, Shape<BN, HD>{});  // (MMA, MMA_N, MMA_D) fp32
  clear(tdKrdK);
  Tensor tScS = thr_s.partition_C(make_identity_tensor(Shape<BM, BN>{}));  // (MMA, MMA_M, MMA_N) → (r, c)
  Tensor tScS_rc = make_tensor(tScS.data(), rowcol(tScS.layout()));         // (rows, cols) → (r, c)
  Tensor tdQcdQ = thr_dq.partition_C(make_identity_tensor(Shape<BM, HD>{}));  // (MMA, MMA_M, MMA_D) → (r, d)
  constexpr int kRows = size<0>(decltype(tScS_rc.layout()){});

  // 16-bit tiles between shared memory and the accumulator's layout by ldmatrix / stmatrix.
  auto s2r = make_tiled_copy_C(Copy_Atom<SM75_U32x4_LDSM_N, Element>{}, mma_s);
  auto r2s = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma_s);
  auto r2s_dq = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma_dq);  // kDirectDq
  auto thr_s2r = s2r.get_thread_slice(tid);
  auto thr_r2s = r2s.get_thread_slice(tid);
  auto thr_r2s_dq = r2s_dq.get_thread_slice(tid);
  const auto dp_addr = matrix_addresses(thr_s2r.partition_S(sdP(_, _, 0)));  // (A, CPY_M, CPY_N), stage 0
  const auto p_addr = matrix_addresses(thr_s2r.partition_S(sP(_, _, 0)));    // (A, CPY_M, CPY_N), stage 0, saved-P
  const auto ds_addr = matrix_addresses(thr_r2s.partition_D(sdS));           // (A, CPY_M, CPY_N)
  const auto dq_addr = [&] {  // (A, CPY_M, CPY_D), kDirectDq
    if constexpr (Cfg::kDirectDq) {
      return matrix_addresses(thr_r2s_dq.partition_D(sdQ));
    } else {
      return 0;
    }
  }();

  // This thread's rows' LSE and D for the step at `at`, loaded a step before they are used (and only scaled
  // there: an operation on a loaded value would wait for the load).
  float lse[kRows], delta[kRows];
  const auto load_rows = [&](const StepCursor& at) {
    const int64_t m0 = int64_t(at.block) * kBlockM;
    const float* lse_rows = params.lse.ptr + params.lse.offset(b, at.head, m0);  // row m0 of the step
    const float* delta_rows = params.delta.ptr + params.delta.offset(b, at.head, m0);
    CUTE_UNROLL
    for (int ri = 0; ri < kRows; ++ri) {
      const int r = get<0>(tScS_rc(ri, 0));
      const bool in = m0 + r < Sq;
      lse[ri] = in && !kSavedP ? lse_rows[r * params.lse.sr] : 0.0f;
      delta[ri] = in ? delta_rows[r * params.delta.sr] : 0.0f;
    }
  };
  if (steps > 0) {
    load_rows(step_at);
    Barrier::wait(&st.k_full, 0);
    if constexpr (!kSavedP) {  // S of step 0
      stage_wait(0);
      warpgroup_gemm<true>(mma_s, sQ(_, _, 0), sK, tSrS);
    }
  }

  // The products in flight at the top of step t: dK of step t − 1, and in recompute S of step t + 1 once
  // issued. wgmma groups complete in order.
  for (int t = 0; t < steps; ++t) {
    const int stage = t % kStages;
    const int64_t h = step_at.head, m0 = int64_t(step_at.block) * kBlockM;
    step_at.advance(first_row_block, row_blocks);
    // S of step t + 1 into the second accumulator: it runs while this step's dS is computed. Issued in every
    // step (straight-line wgmma keeps ptxas from serialising them): the last step's multiplies its own tiles
    // and is never read.
    Tensor tSrS_next = make_fragment_like(tSrS);  // (MMA, MMA_M, MMA_N) fp32, recompute
    if constexpr (!kSavedP) {
      const int next = t + 1 < steps ? t + 1 : t;
      if (next != t) stage_wait(next);
      warpgroup_gemm<true, false>(mma_s, sQ(_, _, next % kStages), sK, tSrS_next);
    } else {
      stage_wait(t);
    }
    float lse2_t[kRows], delta_t[kRows];  // log2-domain LSE and D of this step's rows
    CUTE_UNROLL
    for (int ri = 0; ri < kRows; ++ri) lse2_t[ri] = lse[ri] * kLog2e, delta_t[ri] = delta[ri];

    Tensor tSrdP = make_fragment_like<Element>(tSrS);  // (MMA, MMA_M, MMA_N)
    const uint32_t stage_offset = uint32_t(stage) * Cfg::kPBytes;  // stages are whole swizzle periods apart
    load_matrices(dp_addr, stage_offset, thr_s2r.retile_D(tSrdP));
    Tensor tSrP = make_fragment_like<Element>(tSrS);   // (MMA, MMA_M, MMA_N), saved-P
    if constexpr (kSavedP) load_matrices(p_addr, stage_offset, thr_s2r.retile_D(tSrP));

    Tensor tSrS_rc = make_tensor(tSrS.data(), rowcol(tSrS.layout()));     // (rows, cols)
    Tensor tSrdP_rc = make_tensor(tSrdP.data(), rowcol(tSrdP.layout()));  // (rows, cols)
    Tensor tSrP_rc = make_tensor(tSrP.data(), rowcol(tSrP.layout()));     // (rows, cols), saved-P
    Tensor tSrdS = make_fragment_like<Element>(tSrS);                      // (MMA, MMA_M, MMA_N)
    Tensor tSrdS_rc = make_tensor(tSrdS.data(), rowcol(tSrdS.layout()));  // (rows, cols)
    softmax_backward<Cfg>(tSrdS_rc, tSrS_rc, tSrP_rc, tSrdP_rc, tScS_rc, lse2_t, delta_t, scale_log2, keys, m0, n0);
    // dK of step t − 1 read this warpgroup's columns of sdS; the other warpgroup's dQ of step t − 1, which read
    // them too, completed before the end of that step.
    warpgroup_wait<kSavedP ? 0 : 1>();
    store_matrices(ds_addr, 0, thr_r2s.retile_S(tSrdS));
    // The dQ buffer was last read by the reduce-add of step t − 1.
    if (leader) tma_store_wait<0>();
    cutlass::arch::fence_view_async_shared();  // dS written by threads, read by wgmma
    __syncthreads();
    // Both warpgroups' dK of step t − 1 are done: its stage takes the step kStages after it.
    if (leader && t >= 1 && t - 1 + kStages < steps) load_step(t - 1 + kStages);
    // Step t + 1's rows, loaded under this step's products; first used by step t + 1's dS.
    if (t + 1 < steps) load_rows(step_at);

    Tensor tdQrdQ = partition_fragment_C(mma_dq, Shape<BM, HD>{});  // (MMA, MMA_M, MMA_D) fp32
    warpgroup_gemm<true, false>(mma_dq, sdS, sKt, tdQrdQ);
    warpgroup_gemm<false, false>(mma_dk, sdSt, sQt(_, _, stage), tdKrdK);
    warpgroup_wait<1>();  // all but dK of step t: dQ (and S of step t + 1)
    warpgroup_fence_operand(tdQrdQ);
    if constexpr (!kSavedP) {
      warpgroup_fence_operand(tSrS_next);
      CUTE_UNROLL
      for (int i = 0; i < size(tSrS); ++i) tSrS(i) = tSrS_next(i);
    }
    if constexpr (Cfg::kDirectDq) {  // scaled and rounded here: what is added into dQ is final
      Tensor tdQrdQ_out = make_fragment_like<Element>(tdQrdQ);  // (MMA, MMA_M, MMA_D)
      CUTE_UNROLL
      for (int i = 0; i < size(tdQrdQ); ++i) tdQrdQ_out(i) = Element(tdQrdQ(i) * prob.scale);
      store_matrices(dq_addr, 0, thr_r2s_dq.retile_S(tdQrdQ_out));
    } else {
      // Pairs of adjacent columns as 8-byte shared-memory stores (the swizzle moves 16-byte chunks, so a pair
      // stays together), addressed by 32-bit offsets from the (row, d) of each pair.
      const uint32_t dq_base = smem_addr(st.dq.data());
      CUTE_UNROLL
      for (int i = 0; i < size(tdQrdQ); i += 2) {
        const int offset = Cfg::dq_offset(get<0>(tdQcdQ(i)), get<1>(tdQcdQ(i)));
        store_shared_f2(dq_base + uint32_t(offset) * uint32_t(sizeof(float)), tdQrdQ(i), tdQrdQ(i + 1));
      }
    }
    cutlass::arch::fence_view_async_shared();  // dQ written by threads, read by TMA
    __syncthreads();  // also: both warpgroups' dQ of step t, which read all of sdS, are done
    if (leader) {
      Tensor gdQ = local_tile(mdQ(_, _, h, b), Shape<BM, HD>{}, make_coord(m0 / kBlockM, 0));  // (BM, D)
      auto [tRgdQ, tRsdQ] = tma_partition(params.tma_dq, Int<0>{}, Layout<_1>{},
                                          group_modes<0, 2>(sdQ), group_modes<0, 2>(gdQ));
      copy(params.tma_dq, tRsdQ, tRgdQ);
      tma_store_arrive();
    }
  }
  warpgroup_wait<0>();  // the last step's dK (and its unread S)
  warpgroup_fence_operand(tdKrdK);
  if (leader) tma_store_wait<0>();  // the reduce-adds read shared memory until they complete

  store_dk<Cfg>(mma_dk, tdKrdK, prob, b, kv_head, n0);
}

// dq = scale · dq_accum, converted. A CTA takes items of kConvertItemRows rows of one (b, h), grid-strided;
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
        store_scaled(dq + r * prob.dq.sr + d, v[k], prob.scale, vector);
      }
    }
  }
}

}  // namespace qksoftmax::cuda::sm90
