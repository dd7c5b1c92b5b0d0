// The producers of the pingpong single pass (sp_pp_config.h), one thread each:
//   the load thread takes the CTA's tiles (dealt statically), publishes each in the tile ring (KbTileWriter), and
//   loads per tile K into the K buffer of its turn once that buffer is free (every consumer thread of the tile that
//   used it done with it; with a dK warpgroup, that tile's dK stored from it), per block Q into the next slot of
//   the Q ring (with Cfg::kDqInQ after storing the dQ that the slot's previous block left in it);
//   the dP thread reads the tiles from the ring and loads per block dP into the next slot of the dP ring, after
//   storing the dQ that the slot's previous block left in it (not with kDqInQ); in saved-P also the block's P into
//   its dS buffer, once that buffer's previous block is done with it, completing the same slot's barrier;
//   with a dK warpgroup, the dK store thread reads the tiles from the ring and stores each tile's dK from the K
//   buffer where the dK warpgroup staged it, then hands the buffer back to the load thread.
// Separate threads, so that neither ring waits on the other: a Q slot is freed a turn later than its block's dP
// slot.
#pragma once

#include "cuda/sm90/kb_config.h"
#include "cuda/sm90/kb_producer.cuh"
#include "cuda/sm90/sp_pp_config.h"
#include "cuda/sm90/sp_pp_epilogue.cuh"
#include "cuda/sm90/trace.h"

namespace qksoftmax::cuda::sm90 {

template <class Cfg>
struct SpPpProducer {
  using BM = typename Cfg::BM;
  using BN = typename Cfg::BN;
  using HD = typename Cfg::HD;

  const typename Cfg::Params& params;
  typename Cfg::Storage& st;

  // The load thread. A tile without blocks loads nothing (its dK is zero).
  __device__ void load_q(typename Cfg::QPipeline& q_pipe) {
    const Problem& prob = params.prob;
    const auto& tma = params.tma;
    typename Cfg::Trace trace(KbTraceRole::kLoad, true);
    Tensor sQ = make_tensor(make_smem_ptr(st.q.data()), typename Cfg::SmemLayoutQ{});   // (BM, D, QS)
    Tensor sK = make_tensor(make_smem_ptr(st.k.data()), typename Cfg::SmemLayoutKB{});  // (BN, D, KB)
    Tensor mQ = tma.q.get_tma_tensor(make_shape(int32_t(prob.Sq), HD{}, int32_t(prob.Hq), int32_t(prob.B)));
    Tensor mK = tma.k.get_tma_tensor(make_shape(int32_t(prob.Sk), HD{}, int32_t(prob.Hk), int32_t(prob.B)));
    auto state = cutlass::make_producer_start_state<typename Cfg::QPipeline>();
    int k_loads = 0;  // tiles with blocks so far
    const SpDqStore<Cfg> dq_out{params, st.q.data()};  // (kDqInQ)
    KbTileWriter<Cfg> tiles(params, st);
    for (int index = tiles.first(); tiles.publish(index);) {
      const KbWork<Cfg> work(params.order, params.order.template tile<Cfg::kPairs>(index));
      index = tiles.claim(index);
      bool first = true;
      tile_blocks(work, [&](int64_t h, int mb) {
        q_pipe.producer_acquire(state);  // expects the slot's bytes
        if constexpr (Cfg::kDqInQ) {
          store_previous(dq_out, state);
          record_block(state.index(), work, h, mb);
        }
        trace.mark(KbTracePhase::kAcquire);
        Tensor gQ = local_tile(mQ(_, _, h, work.b), Shape<BM, HD>{}, make_coord(mb, 0));  // (BM, D)
        if (sp_diag(params.diag, kDiagNoQ)) {
          Cfg::TxBarrier::complete_transaction(q_pipe.producer_get_barrier(state), cute::block_rank_in_cluster(),
                                               Cfg::kQBytes);
        } else {
          tma_load_tile(tma.q, *q_pipe.producer_get_barrier(state), gQ, sQ(_, _, state.index()));
        }
        if (first) kb_load_k<Cfg>(params, st, work, mK, sK, k_loads);  // K of the tile, after its first Q
        first = false;
        trace.mark(KbTracePhase::kIssueLoads);
        ++state;
      });
    }
    if constexpr (Cfg::kDqInQ) store_last(q_pipe, dq_out, state);
  }

  // Staging slot `at` of a ring whose slots hold dQ: its previous block's (the ring's previous round, if any) dQ
  // stored by TMA and the store's read awaited.
  template <uint32_t kStages>
  __device__ void store_previous(const SpDqStore<Cfg>& dq_out, const cutlass::PipelineState<kStages>& at) {
    if (at.count() < kStages) return;
    const int32_t* block = st.dq_block[at.index()];
    dq_out.store(at.index(), block[0], block[1], block[2], Cfg::kCluster > 1 ? block[3] : 0);
    tma_store_wait<0>();
  }
  // Staging slot `slot`'s block, recorded for its dQ's store.
  __device__ void record_block(int slot, const KbWork<Cfg>& work, int64_t h, int mb) {
    int32_t* block = st.dq_block[slot];
    block[0] = int32_t(work.b), block[1] = int32_t(h), block[2] = mb;
    if constexpr (Cfg::kCluster > 1) block[3] = work.nb;
  }
  // After the last block: the last slots' dQ stored (each slot acquired without a load: nobody waits for it to fill).
  template <class Pipeline, uint32_t kStages>
  __device__ void store_last(Pipeline& pipe, const SpDqStore<Cfg>& dq_out, cutlass::PipelineState<kStages> state) {
#pragma unroll 1
    for (uint32_t s = 0; s < kStages; ++s, ++state) {
      pipe.producer_acquire(state);
      store_previous(dq_out, state);
    }
  }

  // Each block of a tile in the consumers' order: f(head, row block).
  template <class F>
  __device__ void tile_blocks(const KbWork<Cfg>& work, F&& f) const {
    StepCursor at = work.first();
#pragma unroll 1
    for (int t = 0; t < work.steps; ++t) {
      const int64_t h = at.head;
      const int mb = at.block;
      work.advance(at);
      f(h, mb);
    }
  }

  // Each block of the CTA's tiles, read from the tile ring, in the consumers' order (block g of the CTA is the g-th
  // call): f(work, head, row block).
  template <class F>
  __device__ void for_each_block(F&& f) {
    KbTileReader<Cfg> tiles(params, st);
    for (KbTile tile; tiles.next(tile);) {
      const KbWork<Cfg> work(params.order, tile);
      tile_blocks(work, [&](int64_t h, int mb) { f(work, h, mb); });
    }
  }

  // The dP thread. Per block the next slot of the dP ring, once its previous block's owner hands it back, loaded
  // with the block's dP. The slot comes back with
  // that block's dQ staged in it, stored by TMA here and its read awaited before the load; after the last block,
  // the last slots' dQ stored. In saved-P, block g's P goes into its dS buffer (where its owner then writes dS over
  // it) once block g − kDsBuffers's products are done with the buffer, on the slot's barrier.
  __device__ void load_dp(typename Cfg::PPipeline& p_pipe) {
    const Problem& prob = params.prob;
    const auto& tma = params.tma;
    Tensor sdP = make_tensor(make_smem_ptr(st.dp.data()), typename Cfg::SmemLayoutP{});  // (BM, BN, PS)
    Tensor sP = make_tensor(make_smem_ptr(st.ds.data()), typename Cfg::SmemLayoutdS2{});  // (BM, BN, DB), saved-P
    const auto probs = make_shape(int32_t(prob.Sq), int32_t(prob.Sk), int32_t(prob.Hq), int32_t(prob.B));
    Tensor mdP = tma.dp.get_tma_tensor(probs);  // (Sq, Sk, Hq, B)
    Tensor mP = tma.p.get_tma_tensor(probs);    // (Sq, Sk, Hq, B), saved-P
    int g = 0;  // the CTA's blocks so far
    const SpDqStore<Cfg> dq_out{params, st.dp.data()};  // (not with kDqInQ)
    auto state = cutlass::make_producer_start_state<typename Cfg::PPipeline>();
    for_each_block([&](const KbWork<Cfg>& work, int64_t h, int mb) {
      p_pipe.producer_acquire(state);  // (expects the slot's bytes)
      if constexpr (!Cfg::kDqInQ) {     // the slot's previous dQ stored, this block recorded for its own
        store_previous(dq_out, state);
        record_block(state.index(), work, h, mb);
      }
      Tensor gdP = local_tile(mdP(_, _, h, work.b), Shape<BM, BN>{}, make_coord(mb, work.nb));  // (BM, BN)
      const bool load = !sp_diag(params.diag, kDiagNoP);
      if (load) tma_load_tile(tma.dp, *p_pipe.producer_get_barrier(state), gdP, sdP(_, _, state.index()));
      if constexpr (Cfg::kSavedP) {
        Cfg::await_ds_free(st, g);
        Tensor gP = local_tile(mP(_, _, h, work.b), Shape<BM, BN>{}, make_coord(mb, work.nb));  // (BM, BN)
        if (load) tma_load_tile(tma.p, *p_pipe.producer_get_barrier(state), gP, sP(_, _, Cfg::ds_buffer(g)));
      }
      if (!load) {  // (the diagnostic's slot: its bytes counted without the loads)
        Cfg::TxBarrier::complete_transaction(p_pipe.producer_get_barrier(state), cute::block_rank_in_cluster(),
                                             Cfg::kPSlotBytes);
      }
      ++state;
      ++g;
    });
    if constexpr (!Cfg::kDqInQ) store_last(p_pipe, dq_out, state);
  }

  // The dK store thread (with a dK warpgroup). Per tile with blocks, once the dK warpgroup has written the tile's
  // dK (dk_full): where dK is in TMA's reach, staged in the tile's K buffer, stored from there by one TMA (keys past
  // Sk clipped) and the store's read awaited; then the buffer handed back to the load thread (k_empty) for a later
  // tile's K. (Out of TMA's reach the dK warpgroup stores dK itself, and this thread passes the buffer on once the
  // consumers have read it, k_read.)
  __device__ void store_dk() {
    const Problem& prob = params.prob;
    Tensor sK = make_tensor(make_smem_ptr(st.k.data()), typename Cfg::SmemLayoutKB{});  // (BN, D, KB)
    Tensor mdK = params.tma_dk.get_tma_tensor(make_shape(int32_t(prob.Sk), HD{}, int32_t(prob.Hk), int32_t(prob.B)));
    int k_loads = 0;  // tiles with blocks so far
    KbTileReader<Cfg> tiles(params, st);
    for (KbTile tile; tiles.next(tile);) {
      const KbWork<Cfg> work(params.order, tile);
      if (work.steps == 0) continue;  // (no K loaded; the dK warpgroup stores its zeros)
      const KBufferUse<Cfg> use(k_loads++);
      cutlass::arch::ClusterBarrier::wait(&st.dk_full[use.buffer], use.phase);
      if (!params.dk_by_tma) {
        cutlass::arch::ClusterBarrier::wait(&st.k_read[use.buffer], use.phase);
      } else {
        Tensor gdK = local_tile(mdK(_, _, work.kv_head, work.b), Shape<BN, HD>{}, make_coord(work.nb, 0));  // (BN, D)
        tma_store_tile(params.tma_dk, sK(_, _, use.buffer), gdK);
        tma_store_arrive();
        tma_store_wait<0>();  // (its read of the buffer)
      }
      cutlass::arch::ClusterBarrier::arrive(&st.k_empty[use.buffer]);
    }
  }
};

}  // namespace qksoftmax::cuda::sm90
