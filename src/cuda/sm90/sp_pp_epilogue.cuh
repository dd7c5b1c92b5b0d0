// The pingpong single pass's epilogues: a block's dQ, finished (KbFinish), rounded into a staging tile (the block's
// dP slot, sp_pp_mainloop.cuh) by stmatrix and stored by one TMA; dK of a tile is stored by kb_store_dk
// (kb_epilogue.cuh) from each consumer's accumulator.
#pragma once

#include <cutlass/arch/barrier.h>

#include "cuda/sm90/kb_epilogue.cuh"
#include "cuda/sm90/sp_pp_config.h"

namespace qksoftmax::cuda::sm90 {

// A warpgroup's view of a dQ partial's staging and store: the dQ product, this thread's stmatrix accesses of a
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
  int tid;        // within the warpgroup

  __device__ auto addresses() const {
    typename Cfg::CopydQ r2s;
    return matrix_addresses(
        r2s.get_thread_slice(tid).partition_D(make_tensor(make_smem_ptr(base), typename Cfg::SmemLayoutdQ{})));
  }

  // The dQ partial of step (head, m0), complete, finished (KbFinish), rounded into staging tile `tile` by
  // stmatrix and stored into dQ by one TMA from the warpgroup's first thread once its 128 threads have written it
  // (named barrier `staged`); rows past Sq are clipped by TMA. The caller frees the tile: that thread's
  // tma_store_wait before the tile's next writers pass a barrier after it.
  template <class Addr>
  __device__ void operator()(const FragdQ& tdQrdQ, const Addr& addr, int tile, uint32_t staged, int64_t b,
                             int64_t head, int64_t m0) const {
    const Problem& prob = params.prob;
    typename Cfg::CopydQ r2s;
    with_kb_finish<Cfg>(prob, [&](auto finish) {
      constexpr KbFinish kFinish = decltype(finish)::value;
      Tensor out = make_fragment_like<Element>(tdQrdQ);  // (MMA, 1, 1)
      CUTE_UNROLL
      for (int i = 0; i < size(tdQrdQ); ++i) out(i) = Element(kb_finish<kFinish>(tdQrdQ(i), prob.scale));
      store_matrices(addr, uint32_t(tile) * kTileBytes, r2s.get_thread_slice(tid).retile_S(out));
    });
    cutlass::arch::fence_view_async_shared();  // dQ written by threads, read by TMA
    cutlass::arch::NamedBarrier::sync(Cfg::kWarpgroupThreads, staged);
    if (tid == 0) {
      Tensor mdQ = params.tma_dq.get_tma_tensor(make_shape(int32_t(prob.Sq), HD{}, int32_t(prob.Hq), int32_t(prob.B)));
      Tensor sdQ = make_tensor(make_smem_ptr(base + tile * cosize_v<typename Cfg::SmemLayoutdQ>),
                               typename Cfg::SmemLayoutdQ{});                                                 // (BM, D)
      Tensor gdQ = local_tile(mdQ(_, _, head, b), Shape<BM, HD>{}, make_coord(int(m0 / Cfg::kBlockM), 0));  // (BM, D)
      tma_store_tile(params.tma_dq, sdQ, gdQ);
      tma_store_arrive();
    }
  }
};

}  // namespace qksoftmax::cuda::sm90
