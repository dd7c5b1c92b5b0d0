// The pingpong single pass's dK warpgroup (sp_pp_config.h, kDkWarpgroup): it holds dK of the tile's 128 keys
// (two m64 accumulators, 128 registers a thread) and, per block g of the CTA (the consumers' tiles and blocks,
// read from the same tile ring), as soon as the block's owner has written dS(g) (ds_full), adds dS(g)ᵀ Q(g)
// (SS, M = 128 keys, N = D, K = 64 rows), awaits it, and frees the dS buffer (ds_free, beside the owner's dQ
// product) and Q(g)'s slot (beside the owner's S product); at a tile's end it stores dK.
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

    int g = 0;  // the CTA's blocks so far
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
        cutlass::arch::ClusterBarrier::arrive(&st.ds_free[buf]);  // dS(g) read here
        release_slot(st.q_pipe, q_state);
        trace.mark(PpDkTracePhase::kProduct);
        ++g;
      }
      const Tensor tdKcdK = thr_dk.partition_C(make_identity_tensor(Shape<BN, HD>{}));  // (MMA, 2, 1) → (key, d)
      kb_store_dk<Cfg, Cfg::kBlockN>(params, 0, tdKrdK, tdKcdK, work);
      trace.mark(PpDkTracePhase::kTileEnd);
    }
  }
};

}  // namespace qksoftmax::cuda::sm90
