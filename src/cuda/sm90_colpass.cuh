// Hopper backward, column pass (FlashAttention-2/3 shape): one CTA (one warpgroup) owns a 64-column block of
// a key head; dK stays in registers while the row blocks of every query head of its group stream through
// shared memory by TMA (two stages). Per row block:
//   recompute: S = Q Kᵀ (wgmma), P = exp(S − LSE);  saved-P: P from the P tile
//   dS = P ∘ (dP − D)  → shared memory (bf16/fp16)
//   dQ partial = dS K (wgmma) → fp32 atomics into an accumulator in the workspace
//   dK        += dSᵀ Q (wgmma)
// LSE and D come from the row-statistics pass (sm90_rowstats.cuh). A convert kernel scales dQ at the end.
// Needs 16-byte aligned tensors with 16-byte multiple strides (TMA); not deterministic (atomics).
#pragma once

#include <cutlass/arch/barrier.h>

#include "cuda/sm90_config.h"

namespace qksoftmax::cuda::sm90 {

using namespace cute;

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocksPerSm)
    colpass_kernel(CUTE_GRID_CONSTANT const typename Cfg::Params params) {
  using Element = typename Cfg::Element;
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN, kHeadDim = Cfg::kHeadDim;
  extern __shared__ __align__(128) char smem_raw[];
  auto& st = *reinterpret_cast<typename Cfg::ColPassStorage*>(smem_raw);

  const Problem& prob = params.prob;
  const bool saved_p = prob.mode == BackwardMode::kSavedP;
  const int64_t col_blocks = (prob.Sk + kBlockN - 1) / kBlockN;
  const generic::TileCoord tile = generic::tile_coord(col_blocks, prob.Hk);
  const int64_t b = tile.b, kv_head = tile.h, n0 = tile.tile * kBlockN;
  const int64_t row_blocks = (prob.Sq + kBlockM - 1) / kBlockM;
  const int64_t first_row_block = prob.mask == Mask::kCausal ? n0 / kBlockM : 0;
  const int64_t steps_per_head = row_blocks > first_row_block ? row_blocks - first_row_block : 0;
  const int64_t steps = steps_per_head * prob.group();
  const bool leader = threadIdx.x == 0;

  Tensor sQ = make_tensor(make_smem_ptr(st.q.data()), typename Cfg::SmemLayoutQ{});      // (BM, D, ST)
  Tensor sQt = make_tensor(make_smem_ptr(st.q.data()), typename Cfg::SmemLayoutQt{});    // (D, BM, ST)
  Tensor sK = make_tensor(make_smem_ptr(st.k.data()), typename Cfg::SmemLayoutK{});      // (BN, D)
  Tensor sKt = make_tensor(make_smem_ptr(st.k.data()), typename Cfg::SmemLayoutKt{});    // (D, BN)
  Tensor sdP = make_tensor(make_smem_ptr(st.dp.data()), typename Cfg::SmemLayoutP{});    // (BM, BN, ST)
  Tensor sP = make_tensor(make_smem_ptr(st.p.data()), typename Cfg::SmemLayoutP{});      // (BM, BN, ST)
  Tensor sdS = make_tensor(make_smem_ptr(st.ds.data()), typename Cfg::SmemLayoutdS{});   // (BM, BN)
  Tensor sdSt = make_tensor(make_smem_ptr(st.ds.data()), typename Cfg::SmemLayoutdSt{}); // (BN, BM)

  Tensor mQ = params.tma_q.get_tma_tensor(make_shape(int32_t(prob.Sq), Int<kHeadDim>{}, int32_t(prob.Hq), int32_t(prob.B)));
  Tensor mK = params.tma_k.get_tma_tensor(make_shape(int32_t(prob.Sk), Int<kHeadDim>{}, int32_t(prob.Hk), int32_t(prob.B)));
  Tensor mdP = params.tma_dp.get_tma_tensor(make_shape(int32_t(prob.Sq), int32_t(prob.Sk), int32_t(prob.Hq), int32_t(prob.B)));
  Tensor mP = params.tma_p.get_tma_tensor(make_shape(int32_t(prob.Sq), int32_t(prob.Sk), int32_t(prob.Hq), int32_t(prob.B)));

  if (leader) {
    for (int s = 0; s < Cfg::kStages; ++s) Barrier::init(&st.stage_full[s], 1);
    Barrier::init(&st.k_full, 1);
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  // The leader issues the TMA loads of step t (query head, row block) into stage t % kStages.
  const auto issue_step = [&](int64_t t) {
    const int64_t h = kv_head * prob.group() + t / steps_per_head;
    const int64_t mb = first_row_block + t % steps_per_head;
    const int stage = int(t % Cfg::kStages);
    Barrier::arrive_and_expect_tx(&st.stage_full[stage], Cfg::kQBytes + Cfg::kPBytes * (saved_p ? 2 : 1));
    Tensor gQ = local_tile(mQ(_, _, h, b), Shape<typename Cfg::BM, typename Cfg::HD>{}, make_coord(mb, 0));  // (BM, D)
    Tensor gdP = local_tile(mdP(_, _, h, b), Shape<typename Cfg::BM, typename Cfg::BN>{}, make_coord(mb, n0 / kBlockN));
    auto [tQgQ, tQsQ] = tma_partition(params.tma_q, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sQ(_, _, stage)), group_modes<0, 2>(gQ));
    copy(params.tma_q.with(st.stage_full[stage]), tQgQ, tQsQ);
    auto [tPgdP, tPsdP] = tma_partition(params.tma_dp, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sdP(_, _, stage)), group_modes<0, 2>(gdP));
    copy(params.tma_dp.with(st.stage_full[stage]), tPgdP, tPsdP);
    if (saved_p) {
      Tensor gP = local_tile(mP(_, _, h, b), Shape<typename Cfg::BM, typename Cfg::BN>{}, make_coord(mb, n0 / kBlockN));
      auto [tPgP, tPsP] = tma_partition(params.tma_p, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sP(_, _, stage)), group_modes<0, 2>(gP));
      copy(params.tma_p.with(st.stage_full[stage]), tPgP, tPsP);
    }
  };

  if (leader) {
    Barrier::arrive_and_expect_tx(&st.k_full, Cfg::kKBytes);
    Tensor gK = local_tile(mK(_, _, kv_head, b), Shape<typename Cfg::BN, typename Cfg::HD>{}, make_coord(n0 / kBlockN, 0));
    auto [tKgK, tKsK] = tma_partition(params.tma_k, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sK), group_modes<0, 2>(gK));
    copy(params.tma_k.with(st.k_full), tKgK, tKsK);
    if (steps > 0) issue_step(0);
  }

  typename Cfg::MmaS mma_s;
  typename Cfg::MmadQ mma_dq;
  typename Cfg::MmadK mma_dk;
  auto thr_s = mma_s.get_thread_slice(threadIdx.x);
  Tensor tdKrdK = partition_fragment_C(mma_dk, Shape<typename Cfg::BN, typename Cfg::HD>{});  // (MMA, MMA_N, MMA_D) fp32
  clear(tdKrdK);
  Tensor tScS = thr_s.partition_C(make_identity_tensor(Shape<typename Cfg::BM, typename Cfg::BN>{}));  // (r, c) per element
  Tensor tdQcdQ = mma_dq.get_thread_slice(threadIdx.x).partition_C(
      make_identity_tensor(Shape<typename Cfg::BM, typename Cfg::HD>{}));  // (r, d) per element
  // dP, P and dS between shared memory and the accumulator's layout by ldmatrix / stmatrix (one instruction
  // per 8 × 8 block of a warp instead of a 16-bit access per element).
  auto s2r = make_tiled_copy_C(Copy_Atom<SM75_U32x4_LDSM_N, Element>{}, mma_s);
  auto r2s = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma_s);
  auto thr_s2r = s2r.get_thread_slice(threadIdx.x);
  auto thr_r2s = r2s.get_thread_slice(threadIdx.x);

  const KeyRange keys = prob.keys();
  constexpr float kLog2e = 1.4426950408889634f;
  const float scale_log2 = prob.scale * kLog2e;
  Barrier::wait(&st.k_full, 0);

  Tensor tScS_rc = make_tensor(tScS.data(), rowcol(tScS.layout()));  // (rows, cols) → (r, c)
  constexpr int kRows = size<0>(decltype(tScS_rc.layout()){});
  for (int64_t t = 0; t < steps; ++t) {
    if (leader && t + 1 < steps) issue_step(t + 1);
    const int stage = int(t % Cfg::kStages);
    const int64_t h = kv_head * prob.group() + t / steps_per_head;
    const int64_t m0 = (first_row_block + t % steps_per_head) * kBlockM;
    // LSE and D of this thread's rows, read before the waits so that their latency hides under them.
    float lse_log2[kRows], delta[kRows];
    CUTE_UNROLL
    for (int ri = 0; ri < kRows; ++ri) {
      const int64_t row = m0 + get<0>(tScS_rc(ri, 0));
      const bool row_live = row < prob.Sq;
      lse_log2[ri] = row_live && !saved_p ? params.lse.ptr[params.lse.offset(b, h, row)] * kLog2e : 0.0f;
      delta[ri] = row_live ? params.delta.ptr[params.delta.offset(b, h, row)] : 0.0f;
    }
    Barrier::wait(&st.stage_full[stage], uint32_t((t / Cfg::kStages) & 1));

    // dP (and P) into registers first: the shared-memory reads overlap the product.
    Tensor tSrS = partition_fragment_C(mma_s, Shape<typename Cfg::BM, typename Cfg::BN>{});  // (MMA, MMA_M, MMA_N) fp32
    Tensor tSrdP = make_fragment_like<Element>(tSrS);  // (MMA, MMA_M, MMA_N)
    copy(s2r, thr_s2r.partition_S(sdP(_, _, stage)), thr_s2r.retile_D(tSrdP));
    Tensor tSrP = make_fragment_like<Element>(tSrS);  // (MMA, MMA_M, MMA_N), saved-P
    if (saved_p) copy(s2r, thr_s2r.partition_S(sP(_, _, stage)), thr_s2r.retile_D(tSrP));
    if (!saved_p) warpgroup_gemm<true>(mma_s, sQ(_, _, stage), sK, tSrS);
    Tensor tSrS_rc = make_tensor(tSrS.data(), rowcol(tSrS.layout()));  // (rows, cols)
    Tensor tSrdS = make_fragment_like<Element>(tSrS);  // (MMA, MMA_M, MMA_N)
    Tensor tSrdP_rc = make_tensor(tSrdP.data(), rowcol(tSrdP.layout()));
    Tensor tSrP_rc = make_tensor(tSrP.data(), rowcol(tSrP.layout()));
    Tensor tSrdS_rc = make_tensor(tSrdS.data(), rowcol(tSrdS.layout()));
    // Only a tile that the mask or the last row cuts pays for per-element compares.
    with_mask(keys.cuts(m0, kBlockM, n0, kBlockN), [&](auto mask) {
      CUTE_UNROLL
      for (int ri = 0; ri < size<0>(tSrS_rc); ++ri) {
        const int64_t row = m0 + get<0>(tScS_rc(ri, 0));
        const int limit = mask ? keys.cols_in(row, n0, kBlockN) : kBlockN;
        CUTE_UNROLL
        for (int ci = 0; ci < size<1>(tSrS_rc); ++ci) {
          float ds = 0.0f;
          if (!mask || get<1>(tScS_rc(ri, ci)) < limit) {
            const float p = saved_p ? float(tSrP_rc(ri, ci)) : exp2_fast(tSrS_rc(ri, ci) * scale_log2 - lse_log2[ri]);
            ds = p * (float(tSrdP_rc(ri, ci)) - delta[ri]);
          }
          tSrdS_rc(ri, ci) = Element(ds);
        }
      }
    });
    copy(r2s, thr_r2s.retile_S(tSrdS), thr_r2s.partition_D(sdS));
    cutlass::arch::fence_view_async_shared();  // the generic-proxy writes of dS, seen by wgmma
    __syncthreads();

    Tensor tdQrdQ = partition_fragment_C(mma_dq, Shape<typename Cfg::BM, typename Cfg::HD>{});  // (MMA, MMA_M, MMA_D) fp32
    warpgroup_gemm<true, false>(mma_dq, sdS, sKt, tdQrdQ);  // both products in flight at once
    warpgroup_gemm<false>(mma_dk, sdSt, sQt(_, _, stage), tdKrdK);
    warpgroup_fence_operand(tdQrdQ);
    float* dq_rows = params.dq_accum + ((b * prob.Hq + h) * prob.Sq) * kHeadDim;
    CUTE_UNROLL
    for (int i = 0; i < size(tdQrdQ); i += 2) {  // a wgmma accumulator holds pairs of adjacent columns
      const int64_t row = m0 + get<0>(tdQcdQ(i));
      if (row < prob.Sq) {
        atomicAdd(reinterpret_cast<float2*>(dq_rows + row * kHeadDim + get<1>(tdQcdQ(i))),
                  make_float2(tdQrdQ(i), tdQrdQ(i + 1)));
      }
    }
    __syncthreads();  // stage and sdS are free for the next TMA / step
  }

  // dK = scale · Σ dSᵀ Q
  Tensor tdKcdK = mma_dk.get_thread_slice(threadIdx.x).partition_C(
      make_identity_tensor(Shape<typename Cfg::BN, typename Cfg::HD>{}));  // (c, d) per element
  Element* dk = static_cast<Element*>(prob.dk.ptr);
  CUTE_UNROLL
  for (int i = 0; i < size(tdKrdK); ++i) {
    const int64_t col = n0 + get<0>(tdKcdK(i));
    if (col < prob.Sk) dk[prob.dk.offset(b, kv_head, col, get<1>(tdKcdK(i)))] = Element(tdKrdK(i) * prob.scale);
  }
}

// dq = scale · dq_accum, elementwise.
template <class Element, int kHeadDim>
__global__ void convert_dq_kernel(const Problem prob, const float* dq_accum) {
  const int64_t total = prob.B * prob.Hq * prob.Sq * kHeadDim;
  Element* dq = static_cast<Element*>(prob.dq.ptr);
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total; idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t d = idx % kHeadDim, row = (idx / kHeadDim) % prob.Sq, h = (idx / (kHeadDim * prob.Sq)) % prob.Hq,
                  b = idx / (kHeadDim * prob.Sq * prob.Hq);
    dq[prob.dq.offset(b, h, row, d)] = Element(dq_accum[idx] * prob.scale);
  }
}

}  // namespace qksoftmax::cuda::sm90
