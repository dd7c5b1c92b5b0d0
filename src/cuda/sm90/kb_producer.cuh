// The producers of the key-block pass. One thread takes the CTA's tiles (kb_scheduler.h: its first by its
// index, each next one claimed from the tile counter), publishes each into the tile ring for the other roles
// (KbTileWriter), and issues every TMA load of its CTA: per tile the K block, into the K buffer of its turn
// once that buffer's last reader (the dQ product of the last step of the tile that used it) is complete; per
// step the Q tile and the dP (and P) tile of the tile's keys into the next stage of the stage pipeline, freed by
// each consumer warpgroup once its last product of the step (dK reads Q) is complete. The stages run on across
// tiles: the first stages of a tile load while the consumers finish the previous one. One warp copies each
// step's rows' LSE·log2e and D into the rows pipeline beside the stage, so that the consumers read them from
// shared memory; it reads the tiles from the ring like the consumers.
#pragma once

#include "cuda/sm90/kb_config.h"
#include "cuda/sm90/trace.h"

namespace qksoftmax::cuda::sm90 {

// The K buffer of the CTA's next K load (k_loads counts its K loads so far), once that buffer's last readers (the
// tile that used it kKBuffers tiles before) are done, its barrier armed for a K tile's bytes.
template <class Cfg>
__device__ KBufferUse<Cfg> kb_acquire_k(typename Cfg::Storage& st, int& k_loads) {
  const KBufferUse<Cfg> use(k_loads);
  if (k_loads >= Cfg::kKBuffers) cutlass::arch::ClusterBarrier::wait(&st.k_empty[use.buffer], use.phase ^ 1);
  ++k_loads;
  Cfg::TxBarrier::arrive_and_expect_tx(&st.k_full[use.buffer], Cfg::kKBytes);
  return use;
}

// K of a tile's key block (keys past Sk arrive as zeros) into the K buffer of its turn (kb_acquire_k).
// mK: K as TMA sees it, (keys, d, key head, batch); sK: (BN, D, KB).
template <class Cfg, class GlobalK, class SharedK>
__device__ void kb_load_k(const typename Cfg::Params& params, typename Cfg::Storage& st, const KbWork<Cfg>& work,
                          const GlobalK& mK, SharedK& sK, int& k_loads) {
  const KBufferUse<Cfg> use = kb_acquire_k<Cfg>(st, k_loads);
  Tensor gK = local_tile(mK(_, _, work.kv_head, work.b), Shape<typename Cfg::BN, typename Cfg::HD>{},
                         make_coord(work.nb, 0));  // (BN, D)
  tma_load_tile(params.tma.k, st.k_full[use.buffer], gK, sK(_, _, use.buffer));
}

template <class Cfg>
struct KbProducer {
  using BM = typename Cfg::BM;
  using BN = typename Cfg::BN;
  using HD = typename Cfg::HD;

  const typename Cfg::Params& params;
  typename Cfg::Storage& st;

  // Runs on one thread. A tile without steps loads nothing (its dK is zero).
  template <class StagePipeline>
  __device__ void run(StagePipeline& stage_pipe) {
    const Problem& prob = params.prob;
    const auto& tma = params.tma;
    typename Cfg::Trace trace(KbTraceRole::kLoad, true);
    Tensor sQ = make_tensor(make_smem_ptr(st.q.data()), typename Cfg::SmemLayoutQ{});   // (BM, D, ST)
    Tensor sK = make_tensor(make_smem_ptr(st.k.data()), typename Cfg::SmemLayoutKB{});  // (BN, D, KB)
    Tensor sdP = make_tensor(make_smem_ptr(st.dp.data()), typename Cfg::SmemLayoutP{});  // (BM, BN, ST)
    Tensor sP = make_tensor(make_smem_ptr(st.p.data()), typename Cfg::SmemLayoutP{});    // (BM, BN, ST), saved-P
    Tensor mQ = tma.q.get_tma_tensor(make_shape(int32_t(prob.Sq), HD{}, int32_t(prob.Hq), int32_t(prob.B)));
    Tensor mK = tma.k.get_tma_tensor(make_shape(int32_t(prob.Sk), HD{}, int32_t(prob.Hk), int32_t(prob.B)));
    const auto probs = make_shape(int32_t(prob.Sq), int32_t(prob.Sk), int32_t(prob.Hq), int32_t(prob.B));
    Tensor mdP = tma.dp.get_tma_tensor(probs);
    Tensor mP = tma.p.get_tma_tensor(probs);

    auto state = cutlass::make_producer_start_state<StagePipeline>();
    int k_loads = 0;  // tiles with steps so far
    KbTileWriter<Cfg> tiles(params, st);
    for (int index = tiles.first(); tiles.publish(index);) {
      const KbWork<Cfg> work(params.order, params.order.template tile<Cfg::kPairs>(index));
      if (work.steps == 0) index = tiles.claim(index);
      StepCursor at = work.first();
      // Not unrolled: the claim's result and the steps' coordinates, in unrolled copies, outgrow the producer
      // warpgroup's kProducerRegs registers.
#pragma unroll 1
      for (int t = 0; t < work.steps; ++t, ++state) {
        const int64_t h = at.head;
        const int mb = at.block;
        work.advance(at);
        if (t + 1 == work.steps) index = tiles.claim(index);  // (its latency under the wait below)
        stage_pipe.producer_acquire(state);  // expects the stage's bytes
        trace.mark(KbTracePhase::kAcquire);
        auto* full = stage_pipe.producer_get_barrier(state);
        const int stage = state.index();
        Tensor gQ = local_tile(mQ(_, _, h, work.b), Shape<BM, HD>{}, make_coord(mb, 0));  // (BM, D)
        tma_load_tile(tma.q, *full, gQ, sQ(_, _, stage));
        Tensor gdP = local_tile(mdP(_, _, h, work.b), Shape<BM, BN>{}, make_coord(mb, work.nb));  // (BM, BN)
        tma_load_tile(tma.dp, *full, gdP, sdP(_, _, stage));
        if constexpr (Cfg::kSavedP) {
          Tensor gP = local_tile(mP(_, _, h, work.b), Shape<BM, BN>{}, make_coord(mb, work.nb));  // (BM, BN)
          tma_load_tile(tma.p, *full, gP, sP(_, _, stage));
        }
        // K of the block after the tile's first stage: with one K buffer its wait lasts until the previous
        // tile's last dQ product, and that stage need not wait with it.
        if (t == 0) kb_load_k<Cfg>(params, st, work, mK, sK, k_loads);
        trace.mark(KbTracePhase::kIssueLoads);
      }
    }
  }
};

// The rows warp: per step of each of the CTA's tiles (from the tile ring), what the consumers need of the
// step's 64 rows into the rows pipeline's slot of the step's stage, two rows per lane. Where dS carries the scale
// (kScaleInDs: bf16) it is folded in here, so that dK and dQ need none but the sign: recompute (LSE·log2e −
// log2|scale|, D), as 2^(S·scale·log2e − that) = |scale| · P, the dQ partials and dK then taking the sign
// (KbFinish); saved-P (0, D·scale), as P · (dP·scale − D·scale). A zero scale gives +inf for the first, so that
// P · 0 is 0 whatever the LSE. Otherwise (fp16) (LSE·log2e, D), the scale taken by dQ and dK. Rows past Sq are
// (0, 0).
template <class Cfg>
struct KbRows {
  const typename Cfg::Params& params;
  typename Cfg::Storage& st;

  template <class RowsPipeline>
  __device__ void run(RowsPipeline& rows_pipe, int lane) {
    constexpr int kRowsPerLane = Cfg::kBlockM / 32;
    const Problem& prob = params.prob;
    constexpr bool kFold = kScaleInDs<typename Cfg::Element>;
    const float lse2_shift = kFold ? log2f(fabsf(prob.scale)) : 0.0f;
    const float delta_scale = Cfg::kSavedP && kFold ? prob.scale : 1.0f;
    typename Cfg::Trace trace(KbTraceRole::kRows, true);
    auto state = cutlass::make_producer_start_state<RowsPipeline>();
    KbTileReader<Cfg> tiles(params, st);
    for (KbTile tile; tiles.next(tile);) {
      const KbWork<Cfg> work(params.order, tile);
      StepCursor at = work.first();
      for (int t = 0; t < work.steps; ++t, ++state) {
        const int64_t m0 = int64_t(at.block) * Cfg::kBlockM;
        const float* lse_rows = Cfg::kSavedP ? nullptr : params.lse.ptr + params.lse.offset(work.b, at.head, m0);
        const float* delta_rows = params.delta.ptr + params.delta.offset(work.b, at.head, m0);
        work.advance(at);
        float2 v[kRowsPerLane];  // loaded before the slot is awaited
        CUTE_UNROLL
        for (int k = 0; k < kRowsPerLane; ++k) {
          const int r = kRowsPerLane * lane + k;
          const bool in = m0 + r < prob.Sq;
          float lse2 = 0.0f;  // read only for a row below Sq in recompute (saved-P has no LSE)
          if (!Cfg::kSavedP && in) {
            lse2 = kFold && prob.scale == 0.0f ? INFINITY : lse_rows[r * params.lse.sr] * kLog2e - lse2_shift;
          }
          v[k] = make_float2(lse2, in ? delta_rows[r * params.delta.sr] * delta_scale : 0.0f);
        }
        rows_pipe.producer_acquire(state);
        trace.mark(KbTracePhase::kRowsAcquire);
        CUTE_UNROLL
        for (int k = 0; k < kRowsPerLane; ++k) st.rows[state.index()][kRowsPerLane * lane + k] = v[k];
        rows_pipe.producer_commit(state);  // each lane's arrival releases its own writes
        trace.mark(KbTracePhase::kRowsWrite);
      }
    }
  }
};

}  // namespace qksoftmax::cuda::sm90
