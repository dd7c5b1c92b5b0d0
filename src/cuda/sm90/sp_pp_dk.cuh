// The pingpong single pass's dK warpgroup (sp_pp_config.h, kDkWarpgroup): it holds dK of the tile's 128 keys
// (two m64 accumulators, 128 registers a thread) and, per block g of the CTA (the consumers' tiles and blocks,
// read from the same tile ring), as soon as the block's owner has written dS(g) (ds_full), adds dS(g)ᵀ Q(g)
// (SS, M = 128 keys, N = D, K = 64 rows), awaits it, and frees the dS buffer (ds_free, beside the owner's dQ
// product) and Q(g)'s slot (beside the owner's S product). At a tile's end, once the consumers have read K for the
// last time (k_read), it rounds dK into the tile's K buffer by stmatrix (dk_full), from where the dK store thread
// stores it by TMA (sp_pp_producer.cuh): the next tile's first dS waits behind 16 stmatrix a thread, not behind
// 64 four-byte global stores. Where dK is out of TMA's reach it stores dK from registers instead (the store thread
// then awaits k_read itself).
#pragma once

#include <cutlass/arch/barrier.h>

#include "cuda/sm90/kb_epilogue.cuh"
#include "cuda/sm90/sp_pp_config.h"
#include "cuda/sm90/trace.h"

namespace qksoftmax::cuda::sm90 {

template <class Cfg>
struct SpPpDkWarpgroup {
  using BM = typename Cfg::BM;
  using BN = typename Cfg::BN;
  using HD = typename Cfg::HD;
  using Element = typename Cfg::Element;

  const typename Cfg::Params& params;
  typename Cfg::Storage& st;

  __device__ __forceinline__ void run(typename Cfg::QPipeline& q_pipe) {
    const int tid = threadIdx.x % Cfg::kWarpgroupThreads;
    typename Cfg::Trace trace(KbTraceRole::kDq, tid < 32);
    Tensor sQt = make_tensor(make_smem_ptr(st.q.data()), typename Cfg::SmemLayoutQt{});     // (D, BM, QS)
    Tensor sdSt = make_tensor(make_smem_ptr(st.ds.data()), typename Cfg::SmemLayoutdSt2{});  // (BN, BM, DB)
    typename Cfg::MmadKAll mma_dk;
    auto thr_dk = mma_dk.get_thread_slice(tid);
    Tensor tdKrdK = partition_fragment_C(mma_dk, Shape<BN, HD>{});  // (MMA, 2, 1) fp32
    const Tensor tdKsdS = thr_dk.partition_fragment_A(sdSt);       // (MMA, 2, BM/16, DB) descriptors
    const Tensor tdKsQ = thr_dk.partition_fragment_B(sQt);         // (MMA, 1, BM/16, QS) descriptors
    const Tensor tdKcdK = thr_dk.partition_C(make_identity_tensor(Shape<BN, HD>{}));  // (MMA, 2, 1) → (key, d)

    int g = 0;        // the CTA's blocks so far
    int k_loads = 0;  // tiles with blocks so far
    KbTileReader<Cfg> tiles(params, st);
    for (KbTile tile; tiles.next(tile);) {
      const KbWork<Cfg> work(params.order, tile);
      mma_dk.accumulate_ = GMMA::ScaleOut::One;
      clear(tdKrdK);
      for (int t = 0; t < work.steps; ++t) {  // block g's dS(g)ᵀ Q(g)
        const int buf = Cfg::ds_buffer(g);
        cutlass::arch::ClusterBarrier::wait(&st.ds_full[buf], Cfg::ds_phase(g));
        const auto q_state = block_state<Cfg::kQStages>(g);
        q_pipe.consumer_wait(q_state);  // (the owner awaited it for S; this warpgroup reads it too)
        trace.mark(PpDkTracePhase::kDsWait);
        warpgroup_mma<size<2>(decltype(tdKsdS.layout()){}), false>(mma_dk, tdKsdS(_, _, _, buf),
                                                                  tdKsQ(_, _, _, q_state.index()), tdKrdK);
        cutlass::arch::ClusterBarrier::arrive(&st.ds_free[buf]);  // dS(g) and Q(g) read here
        if constexpr (!Cfg::kDqInQ) release_slot(st.q_pipe, q_state);  // (kDqInQ: by the owner, after dQ's staging)
        trace.mark(PpDkTracePhase::kProduct);
        ++g;
      }
      if (work.steps == 0) {
        kb_store_dk<Cfg, Cfg::kBlockN>(params, 0, tdKrdK, tdKcdK, work);  // (its zeros: no K buffer)
      } else {
        const KBufferUse<Cfg> use(k_loads++);
        if (params.dk_by_tma) {
          cutlass::arch::ClusterBarrier::wait(&st.k_read[use.buffer], use.phase);  // the consumers' last reads of K
          stage(tdKrdK, use.buffer, tid);
        } else {
          kb_store_dk<Cfg, Cfg::kBlockN>(params, 0, tdKrdK, tdKcdK, work);
        }
        cutlass::arch::ClusterBarrier::arrive(&st.dk_full[use.buffer]);  // (to the dK store thread)
      }
      trace.mark(PpDkTracePhase::kTileEnd);
    }
  }

  // dK (this thread's accumulator), finished (KbFinish) and rounded, into K buffer `buffer` by stmatrix, one
  // access's 8 values at a time (a 16-bit copy of the whole accumulator would not fit beside it); fenced for the
  // TMA store that reads it.
  template <class Acc>
  __device__ void stage(const Acc& tdKrdK, int buffer, int tid) const {
    const Problem& prob = params.prob;
    const Tensor acc = typename Cfg::CopydK{}.get_thread_slice(tid).retile_S(tdKrdK);  // (CPY, CPY_M, CPY_N) fp32
    const uint32_t at = smem_addr(st.k.data()) + uint32_t(buffer) * Cfg::kKBytes + Cfg::matrix_first(tid);
    with_kb_finish<Cfg>(prob, [&](auto finish) {
      constexpr KbFinish kFinish = decltype(finish)::value;
      for_each_tile_access<Cfg, Cfg::kBlockN>(at, acc, [&](uint32_t addr, const auto& v) {  // v: (8) fp32
        Tensor out = make_fragment_like<Element>(v);                                       // (8)
        CUTE_UNROLL
        for (int i = 0; i < size(out); ++i) out(i) = Element(kb_finish<kFinish>(v(i), prob.scale));
        store_matrix(addr, out);
      });
    });
    cutlass::arch::fence_view_async_shared();  // dK written by threads, read by TMA
  }
};

}  // namespace qksoftmax::cuda::sm90
