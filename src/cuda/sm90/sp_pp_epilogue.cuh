// The pingpong single pass's epilogues: a block's dQ, finished (KbFinish), rounded into a staging tile (the block's
// dP slot, or with SpPpConfig::kDqInQ its Q slot, sp_pp_mainloop.cuh) by stmatrix, and stored from there by one TMA
// that the thread which loads the slot issues before it loads the slot again (sp_pp_producer.cuh). dK of a tile is the dK warpgroup's (sp_pp_dk.cuh), or in the
// three-warpgroup form stored by kb_store_dk (kb_epilogue.cuh) from each consumer's accumulator.
#pragma once

#include <cutlass/arch/barrier.h>

#include "cuda/sm90/kb_epilogue.cuh"
#include "cuda/sm90/sp_pp_config.h"

namespace qksoftmax::cuda::sm90 {

// A block's dQ staged in shared memory and stored from there: the dQ product, a thread's stmatrix accesses of a
// staging tile at `base` (a (BM, D) tile, SmemLayoutdQ), and dQ as TMA sees it.
template <class Cfg>
struct SpDqStore {
  using Element = typename Cfg::Element;
  using BM = typename Cfg::BM;
  using HD = typename Cfg::HD;
  using FragdQ = decltype(partition_fragment_C(typename Cfg::MmadQ{}, Shape<BM, HD>{}));  // (MMA, 1, 1) fp32
  static constexpr uint32_t kTileBytes = uint32_t(cosize_v<typename Cfg::SmemLayoutdQ> * sizeof(Element));

  const typename Cfg::Params& params;
  Element* base;  // the staging tiles' start in shared memory

  // A warpgroup's thread: its part of the complete dQ of a block, finished (KbFinish), rounded into staging tile
  // `tile` by stmatrix (`at`: its first access in tile 0, smem_addr(base) + Cfg::matrix_first(tid)) and fenced for
  // the TMA store that reads it after the warpgroup's release of the tile.
  __device__ void stage(const FragdQ& tdQrdQ, uint32_t at, int tile, int tid) const {
    const Problem& prob = params.prob;
    typename Cfg::CopydQ r2s;
    with_kb_finish<Cfg>(prob, [&](auto finish) {
      constexpr KbFinish kFinish = decltype(finish)::value;
      Tensor out = make_fragment_like<Element>(tdQrdQ);  // (MMA, 1, 1)
      CUTE_UNROLL
      for (int i = 0; i < size(tdQrdQ); ++i) out(i) = Element(kb_finish<kFinish>(tdQrdQ(i), prob.scale));
      store_tile_matrices<Cfg, Cfg::kBlockM>(at + uint32_t(tile) * kTileBytes, r2s.get_thread_slice(tid).retile_S(out));
    });
    cutlass::arch::fence_view_async_shared();  // dQ written by threads, read by TMA
  }

  // One thread: staging tile `tile` (every row of it staged and released) stored as dQ row block `mb` (rows
  // [64 mb, 64 mb + 64)) of (b, head) by one TMA, or added into it where the block is shared with other CTAs of
  // the cluster (SpPpConfig::shared_block of the CTA's key block `nb`); rows past Sq are clipped. The caller
  // awaits the TMA's read before the tile is written again (tma_store_wait).
  __device__ void store(int tile, int32_t b, int32_t head, int32_t mb, int32_t nb) const {
    const Problem& prob = params.prob;
    Tensor sdQ = make_tensor(make_smem_ptr(base + tile * cosize_v<typename Cfg::SmemLayoutdQ>),
                             typename Cfg::SmemLayoutdQ{});  // (BM, D)
    const auto dq_shape = make_shape(int32_t(prob.Sq), HD{}, int32_t(prob.Hq), int32_t(prob.B));
    bool shared = false;
    if constexpr (Cfg::kCluster > 1) shared = Cfg::shared_block(params.order, nb, mb);
    if (shared && sp_diag(params.diag, kDiagDqDropped)) return;
    if (shared && !sp_diag(params.diag, kDiagDqStored)) {
      Tensor gdQ = local_tile(params.tma_dq_add.get_tma_tensor(dq_shape)(_, _, head, b), Shape<BM, HD>{},
                              make_coord(mb, 0));  // (BM, D)
      tma_store_tile(params.tma_dq_add, sdQ, gdQ);
    } else {
      Tensor gdQ = local_tile(params.tma_dq.get_tma_tensor(dq_shape)(_, _, head, b), Shape<BM, HD>{},
                              make_coord(mb, 0));  // (BM, D)
      tma_store_tile(params.tma_dq, sdQ, gdQ);
    }
    tma_store_arrive();
  }
};

}  // namespace qksoftmax::cuda::sm90
