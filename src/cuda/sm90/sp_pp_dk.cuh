// The pingpong single pass's dK warpgroup (sp_pp_config.h, kDkWarpgroup): it holds dK of the tile's 128 keys
// (two m64 accumulators, 128 registers a thread) and, per block g of the CTA (the consumers' tiles and blocks,
// read from the same tile ring), as soon as the block's owner has written dS(g) (ds_full), adds dS(g)ᵀ Q(g)
// (SS, M = 128 keys, N = D, K = 64 rows), awaits it, and frees the dS buffer (ds_free, beside the owner's dQ
// product; with kDqInDs, ds_read, after which the owner stages dQ there) and Q(g)'s slot (beside the owner's S
// product); at a tile's end it stores dK.
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
    // A half step's (kHalfSteps): M = the early chunk's 64 keys, dK's first m-tile (its first 64 registers).
    typename Cfg::MmadK mma_dkh;
    auto thr_dkh = mma_dkh.get_thread_slice(tid);
    using FragdKHalf = decltype(partition_fragment_C(typename Cfg::MmadK{}, Shape<typename Cfg::HF, HD>{}));
    Tensor tdKrdKh = make_tensor(tdKrdK.data(), typename FragdKHalf::layout_type{});    // (MMA, 1, 1) fp32
    const Tensor tdKsdSh = thr_dkh.partition_fragment_A(Cfg::consumer_keys(sdSt, 0));  // (MMA, 1, BM/16, DB)
    const Tensor tdKsQh = thr_dkh.partition_fragment_B(sQt);                           // (MMA, 1, BM/16, QS)

    int g = 0;  // the CTA's blocks so far
    KbTileReader<Cfg> tiles(params, st);
    for (KbTile tile; tiles.next(tile);) {
      const KbWork<Cfg> work(params.order, tile);
      mma_dk.accumulate_ = GMMA::ScaleOut::One;
      mma_dkh.accumulate_ = GMMA::ScaleOut::One;
      clear(tdKrdK);
      // Block g's dS(g)ᵀ Q(g), over the tile's 128 keys or a half step's first 64.
      const auto add_block = [&](auto is_half) __attribute__((always_inline)) {
        const int buf = Cfg::ds_buffer(g);
        cutlass::arch::ClusterBarrier::wait(&st.ds_full[buf], Cfg::ds_phase(g));
        const auto q_state = block_state<Cfg::kQStages>(g);
        q_pipe.consumer_wait(q_state);  // (the owner awaited it for S; this warpgroup reads it too)
        trace.mark(PpDkTracePhase::kDsWait);
        if constexpr (decltype(is_half)::value) {
          warpgroup_mma<size<2>(decltype(tdKsdSh.layout()){}), false>(mma_dkh, tdKsdSh(_, _, _, buf),
                                                                     tdKsQh(_, _, _, q_state.index()), tdKrdKh);
        } else {
          warpgroup_mma<size<2>(decltype(tdKsdS.layout()){}), false>(mma_dk, tdKsdS(_, _, _, buf),
                                                                    tdKsQ(_, _, _, q_state.index()), tdKrdK);
        }
        // dS(g) read here: its buffer freed (or, with kDqInDs, open to its owner's dQ).
        cutlass::arch::ClusterBarrier::arrive(Cfg::kDqInDs ? &st.ds_read[buf] : &st.ds_free[buf]);
        release_slot(st.q_pipe, q_state);
        trace.mark(PpDkTracePhase::kProduct);
        ++g;
      };
      if constexpr (Cfg::kChunked) {  // the blocks of the walk's positions, in order
        const SpChunkWalk walk = Cfg::walk(params, work.nb);
        for (int k = 0; k < walk.positions(); ++k) {
          const int seen = walk.seen(walk.row_block(k));
          if (Cfg::kHalfSteps && seen == 1) {
            add_block(std::true_type{});
          } else if (seen > 0) {
            add_block(std::false_type{});
          }
        }
      } else {
        for (int t = 0; t < work.steps; ++t) add_block(std::false_type{});
      }
      const Tensor tdKcdK = thr_dk.partition_C(make_identity_tensor(Shape<BN, HD>{}));  // (MMA, 2, 1) → (key, d)
      if constexpr (Cfg::kChunked) {
        // The early chunk's keys are the tile's rows 0-63 (m-tile 0), the late chunk's rows 64-127 (m-tile 1):
        // each stored to its own keys (the late one's key0 a chunk before its keys, as its rows start at 64).
        const SpChunkWalk walk = Cfg::walk(params, work.nb);
        KbWork<Cfg> early = work, late = work;
        early.n0 = int64_t(walk.early()) * Cfg::kChunk;
        late.n0 = int64_t(walk.late() - 1) * Cfg::kChunk;
        kb_store_dk<Cfg, Cfg::kChunk>(params, 0, tdKrdK(_, 0, _), tdKcdK(_, 0, _), early);
        kb_store_dk<Cfg, Cfg::kBlockN>(params, 0, tdKrdK(_, 1, _), tdKcdK(_, 1, _), late);
      } else {
        kb_store_dk<Cfg, Cfg::kBlockN>(params, 0, tdKrdK, tdKcdK, work);
      }
      trace.mark(PpDkTracePhase::kTileEnd);
    }
  }
};

}  // namespace qksoftmax::cuda::sm90
