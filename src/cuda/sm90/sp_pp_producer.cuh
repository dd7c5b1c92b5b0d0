// The producers of the pingpong single pass (sp_pp_config.h), one thread each:
//   the load thread takes the CTA's tiles (dealt statically), publishes each in the tile ring (KbTileWriter), and
//   loads per tile K into the K buffer of its turn once that buffer's last readers (every consumer thread of the
//   tile that used it) are done, per block Q into the next slot of the Q ring;
//   the dP thread reads the tiles from the ring and loads per block dP into the next slot of the dP ring, after
//   storing the dQ that the slot's previous block left in it (without kDqInDs);
//   with kDqInDs, the dQ thread reads the tiles from the ring too and stores each block's dQ from its dS buffer.
// Separate threads, so that neither ring waits on the other: a Q slot is freed a turn later than its block's dP
// slot, and (kDqInDs) a dQ store waits on its block's turn.
#pragma once

#include "cuda/sm90/kb_config.h"
#include "cuda/sm90/kb_producer.cuh"
#include "cuda/sm90/sp_pp_config.h"
#include "cuda/sm90/sp_pp_epilogue.cuh"
#include "cuda/sm90/trace.h"

namespace qksoftmax::cuda::sm90 {

// With chunks (SpPpConfig::kChunked): K of a tile, its early and late chunks into the rows 0-63 and 64-127 of the K
// buffer of its turn (kb_acquire_k). A late chunk past Sk is loaded as TMA's zeros.
template <class Cfg, class GlobalK, class SharedK>
__device__ void sp_load_k_chunks(const typename Cfg::Params& params, typename Cfg::Storage& st,
                                 const KbWork<Cfg>& work, const SpChunkWalk& walk, const GlobalK& mK, SharedK& sK,
                                 int& k_loads) {
  using CH = typename Cfg::CH;
  using HD = typename Cfg::HD;
  const KBufferUse<Cfg> use = kb_acquire_k<Cfg>(st, k_loads);
  const int chunk[2] = {walk.early(), walk.late()};
  CUTE_UNROLL
  for (int half = 0; half < 2; ++half) {
    Tensor gK = local_tile(mK(_, _, work.kv_head, work.b), Shape<CH, HD>{}, make_coord(chunk[half], 0));  // (CH, D)
    Tensor sKh = local_tile(sK(_, _, use.buffer), Shape<CH, HD>{}, make_coord(half, 0));               // (CH, D)
    tma_load_tile(params.tma.k, st.k_full[use.buffer], gK, sKh);
  }
}

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
    KbTileWriter<Cfg> tiles(params, st);
    for (int index = tiles.first(); tiles.publish(index);) {
      const KbWork<Cfg> work(params.order, params.order.template tile<Cfg::kPairs>(index));
      index = tiles.claim(index);
      bool first = true;
      tile_blocks(work, [&](const SpChunkWalk& walk, int64_t h, int mb) {
        q_pipe.producer_acquire(state);  // expects the slot's bytes
        trace.mark(KbTracePhase::kAcquire);
        Tensor gQ = local_tile(mQ(_, _, h, work.b), Shape<BM, HD>{}, make_coord(mb, 0));  // (BM, D)
        tma_load_tile(tma.q, *q_pipe.producer_get_barrier(state), gQ, sQ(_, _, state.index()));
        if (first) {  // K of the tile, after its first Q
          if constexpr (Cfg::kChunked) {
            sp_load_k_chunks<Cfg>(params, st, work, walk, mK, sK, k_loads);
          } else {
            kb_load_k<Cfg>(params, st, work, mK, sK, k_loads);
          }
        }
        first = false;
        trace.mark(KbTracePhase::kIssueLoads);
        ++state;
      });
    }
  }

  // Each block of a tile in the consumers' order: f(walk, head, row block), walk the tile's chunk walk (kChunked:
  // its positions where the CTA sees a chunk; a placeholder otherwise).
  template <class F>
  __device__ void tile_blocks(const KbWork<Cfg>& work, F&& f) const {
    if constexpr (Cfg::kChunked) {
      const SpChunkWalk walk = Cfg::walk(params, work.nb);
#pragma unroll 1
      for (int k = 0; k < walk.positions(); ++k) {
        const int t = walk.row_block(k);
        if (walk.seen(t) > 0) f(walk, work.kv_head * work.group + walk.head(k), t);
      }
    } else {
      const SpChunkWalk walk{};
      StepCursor at = work.first();
#pragma unroll 1
      for (int t = 0; t < work.steps; ++t) {
        const int64_t h = at.head;
        const int mb = at.block;
        work.advance(at);
        f(walk, h, mb);
      }
    }
  }

  // Each block of the CTA's tiles, read from the tile ring, in the consumers' order (block g of the CTA is the g-th
  // call): f(work, walk, head, row block).
  template <class F>
  __device__ void for_each_block(F&& f) {
    KbTileReader<Cfg> tiles(params, st);
    for (KbTile tile; tiles.next(tile);) {
      const KbWork<Cfg> work(params.order, tile);
      tile_blocks(work, [&](const SpChunkWalk& walk, int64_t h, int mb) { f(work, walk, h, mb); });
    }
  }

  // The dP thread. Per block the next slot of the dP ring, once its previous block's owner hands it back, loaded
  // with the block's dP (with chunks, each half of the slot from its chunk's columns). Without kDqInDs the slot
  // comes back with that block's dQ staged in it, stored by TMA here and its read awaited before the load; after
  // the last block, the last slots' dQ stored.
  __device__ void load_dp(typename Cfg::PPipeline& p_pipe) {
    const Problem& prob = params.prob;
    const auto& tma = params.tma;
    Tensor sdP = make_tensor(make_smem_ptr(st.dp.data()), typename Cfg::SmemLayoutP{});  // (BM, BN, PS)
    Tensor mdP = tma.dp.get_tma_tensor(make_shape(int32_t(prob.Sq), int32_t(prob.Sk), int32_t(prob.Hq), int32_t(prob.B)));
    const SpDqStore<Cfg> dq_out{params, st.dp.data()};
    auto state = cutlass::make_producer_start_state<typename Cfg::PPipeline>();
    // Slot `state`'s block of the ring's previous round (if any): its dQ stored, its read awaited.
    const auto store_previous = [&](const cutlass::PipelineState<Cfg::kPStages>& at) {
      if (at.count() < uint32_t(Cfg::kPStages)) return;
      const int32_t* block = st.dq_block[at.index()];
      dq_out.store(at.index(), block[0], block[1], block[2], Cfg::kCluster > 1 ? block[3] : 0);
      tma_store_wait<0>();
    };
    for_each_block([&](const KbWork<Cfg>& work, const SpChunkWalk& walk, int64_t h, int mb) {
      p_pipe.producer_acquire(state);  // (expects the slot's bytes)
      if constexpr (!Cfg::kDqInDs) {   // the slot's previous dQ stored, this block recorded for its own
        store_previous(state);
        int32_t* block = st.dq_block[state.index()];
        block[0] = int32_t(work.b), block[1] = int32_t(h), block[2] = mb;
        if constexpr (Cfg::kCluster > 1) block[3] = work.nb;
      }
      if constexpr (Cfg::kChunked) {
        using CH = typename Cfg::CH;
        const int chunk[2] = {walk.early(), walk.late()};
        CUTE_UNROLL
        for (int half = 0; half < 2; ++half) {
          Tensor gdP = local_tile(mdP(_, _, h, work.b), Shape<BM, CH>{}, make_coord(mb, chunk[half]));  // (BM, CH)
          Tensor sdPh = local_tile(sdP(_, _, state.index()), Shape<BM, CH>{}, make_coord(0, half));  // (BM, CH)
          tma_load_tile(tma.dp, *p_pipe.producer_get_barrier(state), gdP, sdPh);
        }
      } else {
        Tensor gdP = local_tile(mdP(_, _, h, work.b), Shape<BM, BN>{}, make_coord(mb, work.nb));  // (BM, BN)
        tma_load_tile(tma.dp, *p_pipe.producer_get_barrier(state), gdP, sdP(_, _, state.index()));
      }
      ++state;
    });
    if constexpr (!Cfg::kDqInDs) {
      // The last blocks' slots (acquired without a load: nobody waits for them to fill).
#pragma unroll 1
      for (int s = 0; s < Cfg::kPStages; ++s, ++state) {
        p_pipe.producer_acquire(state);
        store_previous(state);
      }
    }
  }

  // The dQ thread (kDqInDs). Per block g, once its owner has staged its dQ in dS buffer g mod 3 (dq_full), the
  // block stored (or added, sp_pp_epilogue.cuh) from there by TMA, its read awaited, and the buffer handed to
  // block g + 3's dS (ds_free).
  __device__ void store_dq() {
    const SpDqStore<Cfg> dq_out{params, st.ds.data()};
    int g = 0;
    for_each_block([&](const KbWork<Cfg>& work, const SpChunkWalk&, int64_t h, int mb) {
      const int buf = Cfg::ds_buffer(g);
      cutlass::arch::ClusterBarrier::wait(&st.dq_full[buf], Cfg::ds_phase(g));
      dq_out.store(buf, int32_t(work.b), int32_t(h), mb, work.nb);
      tma_store_wait<0>();
      cutlass::arch::ClusterBarrier::arrive(&st.ds_free[buf]);
      ++g;
    });
  }
};

}  // namespace qksoftmax::cuda::sm90
