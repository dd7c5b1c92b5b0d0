// The producer of the single-pass backward: one thread issues every TMA load of its CTA. Per work item the
// CTA's four K chunks (K pipeline, one stage, freed by the consumers after their last dQ product); per step
// the Q tile and the live chunks of dP (and P) into the next stage of the stage pipeline (freed by the
// consumers once their dQ and dK products of the step are done). Chunk u goes to position Cfg::pos(u).
#pragma once

#include "cuda/sm90/bwd_config.h"
#include "cuda/sm90/mask.h"
#include "cuda/sm90/tile_scheduler.h"
#include "cuda/sm90/trace.h"

namespace qksoftmax::cuda::sm90 {

template <class Cfg>
struct BwdProducer {
  using Element = typename Cfg::Element;
  using BM = typename Cfg::BM;
  using CK = typename Cfg::CK;
  using HD = typename Cfg::HD;
  using Mask = typename Cfg::Mask;

  const typename Cfg::Params& params;
  typename Cfg::Storage& st;

  // Runs on one thread.
  template <class StagePipeline, class KPipeline>
  __device__ void run(StagePipeline& stage_pipe, KPipeline& k_pipe, const Mask& mask) {
    const Problem& prob = params.prob;
    const auto& tma = params.tma;
    const ItemSteps<Cfg::kBlockM> steps(prob);
    typename Cfg::Trace trace(TraceRole::kProducer, true);

    Tensor sQ = make_tensor(make_smem_ptr(st.q.data()), typename Cfg::SmemLayoutQ{});   // (BM, D, ST)
    Tensor sK = make_tensor(make_smem_ptr(st.k.data()), typename Cfg::SmemLayoutK{});   // (BN, D)
    Tensor sdP = make_tensor(make_smem_ptr(st.dp.data()), typename Cfg::SmemLayoutP{});  // (BM, BN, ST)
    Tensor sP = make_tensor(make_smem_ptr(st.p.data()), typename Cfg::SmemLayoutP{});    // (BM, BN, ST), saved-P
    Tensor mQ = tma.q.get_tma_tensor(make_shape(int32_t(prob.Sq), HD{}, int32_t(prob.Hq), int32_t(prob.B)));
    Tensor mK = tma.k.get_tma_tensor(make_shape(int32_t(prob.Sk), HD{}, int32_t(prob.Hk), int32_t(prob.B)));
    const auto probs = make_shape(int32_t(prob.Sq), int32_t(prob.Sk), int32_t(prob.Hq), int32_t(prob.B));
    Tensor mdP = tma.dp.get_tma_tensor(probs);
    Tensor mP = tma.p.get_tma_tensor(probs);

    auto stage_state = cutlass::make_producer_start_state<StagePipeline>();
    auto k_state = cutlass::make_producer_start_state<KPipeline>();
    PersistentScheduler sched(params.work, params.heads, prob.Hk, params.cluster);
    for (WorkItem item; sched.next(item);) {
      k_pipe.producer_acquire(k_state);
      CUTE_UNROLL
      for (int u = 0; u < Cfg::kChunks; ++u) {  // keys past Sk arrive as zeros
        Tensor gK = local_tile(mK(_, _, item.kv_head, item.b), Shape<CK, HD>{},
                               make_coord(int(mask.key0(u) / Cfg::kChunk), 0));  // (CK, D)
        Tensor sKu = local_tile(sK, Shape<CK, HD>{}, make_coord(Cfg::pos(u), 0));         // (CK, D)
        tma_load_tile(tma.k, *k_pipe.producer_get_barrier(k_state), gK, sKu);
      }
      ++k_state;

      for (int t = 0; t < steps.count; ++t) {
        const int64_t h = steps.head(item, t);
        const int mb = steps.row_block(t);
        const int live = mask.live(steps.row0(t));
        stage_pipe.producer_acquire(stage_state);  // expects the Q tile's bytes
        trace.mark(TracePhase::kAcquire);
        if (live > 0) {
          stage_pipe.producer_expect_transaction(stage_state, uint32_t(live) * Cfg::kPChunkBytes * (Cfg::kSavedP ? 2 : 1));
        }
        auto* full = stage_pipe.producer_get_barrier(stage_state);
        const int stage = stage_state.index();
        Tensor gQ = local_tile(mQ(_, _, h, item.b), Shape<BM, HD>{}, make_coord(mb, 0));  // (BM, D)
        tma_load_tile(tma.q, *full, gQ, sQ(_, _, stage));
        for (int u = 0; u < live; ++u) {
          const int nb = int(mask.key0(u) / Cfg::kChunk);
          Tensor gdP = local_tile(mdP(_, _, h, item.b), Shape<BM, CK>{}, make_coord(mb, nb));   // (BM, CK)
          Tensor sdPu = local_tile(sdP(_, _, stage), Shape<BM, CK>{}, make_coord(0, Cfg::pos(u)));  // (BM, CK)
          tma_load_tile(tma.dp, *full, gdP, sdPu);
          if constexpr (Cfg::kSavedP) {
            Tensor gP = local_tile(mP(_, _, h, item.b), Shape<BM, CK>{}, make_coord(mb, nb));  // (BM, CK)
            Tensor sPu = local_tile(sP(_, _, stage), Shape<BM, CK>{}, make_coord(0, Cfg::pos(u)));  // (BM, CK)
            tma_load_tile(tma.p, *full, gP, sPu);
          }
        }
        ++stage_state;
        trace.mark(TracePhase::kIssueLoads);
      }
    }
  }
};

}  // namespace qksoftmax::cuda::sm90
