// The single pass's dQ partials (sp_config.h): staged and stored by the consumer of a step's turn
// (sp_mainloop.cuh), or, with kDqWarpgroup, by a warpgroup of their own that also issues their products.
//
// The dQ warpgroup, per step g of the CTA (the consumers' tiles and steps, read from the same tile ring):
//   both consumers' dS of step g awaited (the dS barrier of buffer g mod 2: the consumers arrive, it syncs);
//   dQ = dS K over the CTA's 128 keys and all of D issued and awaited; the dS buffer freed (ds_empty, which the
//   consumers await before they write it at step g + 2);
//   the partial rounded into its staging buffer (free once the previous partial's TMA store has read it) and
//   stored into dQ by one TMA;
// and per tile, its K buffer handed back after the tile's last product.
#pragma once

#include <cutlass/arch/barrier.h>

#include "cuda/sm90/kb_epilogue.cuh"
#include "cuda/sm90/sp_config.h"
#include "cuda/sm90/trace.h"

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

template <class Cfg>
struct SpDqWarpgroup {
  using BM = typename Cfg::BM;
  using HD = typename Cfg::HD;
  static constexpr int kBlockM = Cfg::kBlockM, kBuffers = Cfg::kBuffers;

  const typename Cfg::Params& params;
  typename Cfg::Storage& st;

  __device__ void run() {
    const int tid = threadIdx.x % Cfg::kWarpgroupThreads;
    typename Cfg::Trace trace(KbTraceRole::kDq, tid < 32);
    Tensor sdS = make_tensor(make_smem_ptr(st.ds.data()), typename Cfg::SmemLayoutdS2{});   // (BM, BN, DB)
    Tensor sKt = make_tensor(make_smem_ptr(st.k.data()), typename Cfg::SmemLayoutKtB{});    // (D, BN, KB)
    typename Cfg::MmadQ mma_dq;
    auto thr_dq = mma_dq.get_thread_slice(tid);
    const Tensor tdQrdS = thr_dq.partition_fragment_A(sdS);  // (MMA, 1, BN/16, DB) descriptors
    const Tensor tdQrK = thr_dq.partition_fragment_B(sKt);   // (MMA, 1, BN/16, KB) descriptors
    const SpDqStore<Cfg> store{params, st.dq.stage.data(), tid};
    const auto dq_addr = store.addresses();  // (A, CPY_M, CPY_N)

    int g = 0;        // the CTA's steps so far
    int k_loads = 0;  // tiles with steps so far
    KbTileReader<Cfg> tiles(params, st);
    for (KbTile tile; tiles.next(tile);) {
      const KbWork<Cfg> work(params.order, tile);
      const KBufferUse<Cfg> k_use(k_loads);
      if (work.steps > 0) {
        ++k_loads;
        Cfg::TxBarrier::wait(&st.k_full[k_use.buffer], k_use.phase);
      }
      StepCursor at = work.first();
      for (int t = 0; t < work.steps; ++t, ++g) {
        const int buf = g % kBuffers;
        const int64_t head = at.head;
        const int64_t m0 = int64_t(at.block) * kBlockM;
        work.advance(at);
        cutlass::arch::NamedBarrier::sync(Cfg::kDsBarrierThreads, Cfg::kDsBarrier + buf);  // both consumers' dS
        trace.mark(SpDqTracePhase::kDsWait);
        typename SpDqStore<Cfg>::FragdQ tdQrdQ;  // (MMA, 1, 1) fp32
        warpgroup_mma<size<2>(decltype(tdQrK.layout()){}), true>(mma_dq, tdQrdS(_, _, _, buf),
                                                                 tdQrK(_, _, _, k_use.buffer), tdQrdQ);
        cutlass::arch::ClusterBarrier::arrive(&st.dq.ds_empty[buf]);  // this thread's part of the product read it
        trace.mark(SpDqTracePhase::kProduct);
        // The staging tile is free once the previous partial's store has read it.
        if (tid == 0) tma_store_wait<0>();
        cutlass::arch::NamedBarrier::sync(Cfg::kWarpgroupThreads, Cfg::kDqStagedBarrier + 1);
        trace.mark(SpDqTracePhase::kStageFree);
        store(tdQrdQ, dq_addr, 0, Cfg::kDqStagedBarrier, work.b, head, m0);
        trace.mark(SpDqTracePhase::kStore);
      }
      if (work.steps > 0) cutlass::arch::ClusterBarrier::arrive(&st.k_empty[k_use.buffer]);  // its last product done
      trace.mark(SpDqTracePhase::kTileEnd);
    }
    if (tid == 0) tma_store_wait<0>();  // the last dQ store reads shared memory until it completes
  }
};

}  // namespace qksoftmax::cuda::sm90
