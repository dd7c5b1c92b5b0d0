// The consumer warpgroups of the single pass (sp_config.h): the key-block step (kb_mainloop.cuh) with each row's
// statistics computed by the consumers themselves, a step ahead (sp_stats.cuh). Consumer w owns keys
// [n0 + 64w, n0 + 64w + 64) of the tile's block. Per 64-row step t (g counting the CTA's steps over its tiles):
//   S(t + 1) = Q(t + 1) K_wᵀ issued at the step's top, so that it runs under the combine and dS; where step g − 1
//   was this consumer's dQ turn, its dQ partial (in flight since) is awaited, rounded into its step's dS buffer
//   and stored by one TMA first (at most 128 keys: each dQ row block has exactly one step; stored, not added);
//   the step's statistics combined (both consumers' partials, written in step t − 1), dS = P_c ∘ (dP · f − f · D)
//   into the step's dS buffer;
//   dK += dSᵀ Q issued from the dS buffer (this consumer's dS written: its own barrier), and on its turn, once
//   the other consumer's dS is written (the dS barrier), the dQ partial dS K over the CTA's 128 keys, left in
//   flight into the next step;
//   S(t + 1) awaited, then the statistics a step ahead while dK (and dQ) run: P_c(t + 1), dP(t + 1) and this
//   consumer's partials; dK awaited before the arrival on the statistics barrier (the dS buffer is then read no
//   more by it); the stage released.
// The two consumers meet once a step at the statistics (each needs the other's partials) and at the dS barrier
// (the consumer of the dQ turn needs the other's dS). With a dQ warpgroup (kDqWarpgroup, sp_dq.cuh) no step is a
// consumer's turn: both arrive at the dS barrier, which that warpgroup syncs, and wait for its product of step
// g − 2 before they write dS buffer g mod 2.
#pragma once

#include <cutlass/arch/barrier.h>

#include "cuda/sm90/kb_epilogue.cuh"
#include "cuda/sm90/sp_config.h"
#include "cuda/sm90/sp_dq.cuh"
#include "cuda/sm90/sp_stats.cuh"
#include "cuda/sm90/trace.h"

namespace qksoftmax::cuda::sm90 {

template <class Cfg>
struct SpMainloop {
  using Element = typename Cfg::Element;
  using BM = typename Cfg::BM;
  using HD = typename Cfg::HD;
  using HF = typename Cfg::HF;
  static constexpr int kBlockM = Cfg::kBlockM, kHalf = Cfg::kHalf, kBuffers = Cfg::kBuffers;

  const typename Cfg::Params& params;
  typename Cfg::Storage& st;
  int w;  // this consumer, 0 or 1

  template <class StagePipeline>
  __device__ void run(StagePipeline& stage_pipe) {
    constexpr bool kDqWarpgroup = Cfg::kDqWarpgroup;  // the dQ products are not the consumers'
    const Problem& prob = params.prob;
    const int tid = threadIdx.x % Cfg::kWarpgroupThreads;
    typename Cfg::Trace trace(w == 0 ? KbTraceRole::kConsumer0 : KbTraceRole::kConsumer1, tid < 32);
    // What f carries beyond 2^(m_own − LSE·log2e): |scale| where dS carries the scale (KbRows' fold).
    const float fold = kScaleInDs<Element> ? fabsf(prob.scale) : 1.0f;
    SpStats<Cfg> stats{prob, st, w, tid, prob.keys(), prob.scale * kLog2e, fold};
    using FragS = typename SpStats<Cfg>::FragS;      // (MMA, 1, 1) fp32
    using FragdS = typename SpStats<Cfg>::FragS16;   // (MMA, 1, 1)
    const auto dp_addr = stats.dp_addresses();       // (A, CPY_M, CPY_N) of stage 0
    const auto ds_addr = stats.ds_addresses();       // (A, CPY_M, CPY_N) of buffer 0

    Tensor sQt = make_tensor(make_smem_ptr(st.q.data()), typename Cfg::SmemLayoutQt{});     // (D, BM, ST)
    Tensor sKt = make_tensor(make_smem_ptr(st.k.data()), typename Cfg::SmemLayoutKtB{});    // (D, BN, KB)
    Tensor sdS = make_tensor(make_smem_ptr(st.ds.data()), typename Cfg::SmemLayoutdS2{});   // (BM, BN, DB)
    Tensor sdSt = make_tensor(make_smem_ptr(st.ds.data()), typename Cfg::SmemLayoutdSt2{});  // (BN, BM, DB)

    // dK += dSᵀ Q, both operands from shared memory.
    typename Cfg::MmadK mma_dk;
    auto thr_dk = mma_dk.get_thread_slice(tid);
    Tensor tdKrdK = partition_fragment_C(mma_dk, Shape<HF, HD>{});                              // (MMA, 1, 1) fp32
    const Tensor tdKsdS = thr_dk.partition_fragment_A(Cfg::consumer_keys(sdSt, w));  // (MMA, 1, BM/16, DB)
    const Tensor tdKsQ = thr_dk.partition_fragment_B(sQt);                           // (MMA, 1, BM/16, ST)
    mma_dk.accumulate_ = GMMA::ScaleOut::One;

    typename Cfg::MmadQ mma_dq;
    auto thr_dq = mma_dq.get_thread_slice(tid);
    const Tensor tdQrdS = thr_dq.partition_fragment_A(sdS);  // (MMA, 1, BN/16, DB) descriptors
    const Tensor tdQrK = thr_dq.partition_fragment_B(sKt);   // (MMA, 1, BN/16, KB) descriptors
    using FragdQ = decltype(partition_fragment_C(mma_dq, Shape<BM, HD>{}));  // (MMA, 1, 1) fp32

    const auto stats_arrive = [&](int g) {  // this thread's partials of step g written (a release at CTA scope)
      cutlass::arch::ClusterBarrier::arrive(&st.stats_full[g % Cfg::kStatBuffers]);
    };
    const auto stats_wait = [&](int g) {  // step g's partials, every consumer thread's, awaited
      cutlass::arch::ClusterBarrier::wait(&st.stats_full[g % Cfg::kStatBuffers], (g / Cfg::kStatBuffers) & 1);
    };

    // The dQ partial of step (head, m0), complete, rounded into the step's dS buffer `buf` (its readers, the dQ
    // product and both consumers' dK products, are done) and stored by TMA (SpDqStore). The storing thread waits
    // for the store's read of the buffer before it arrives at a later step's dS barrier: the buffer's next writers
    // (both consumers, two steps on) pass that barrier first.
    const SpDqStore<Cfg> store{params, st.ds.data(), tid};
    const auto dq_addr = store.addresses();  // (A, CPY_M, CPY_N) of dS buffer 0
    const auto store_dq = [&](const FragdQ& tdQrdQ, int buf, int64_t b, int64_t head, int64_t m0) {
      store(tdQrdQ, dq_addr, buf, Cfg::kDqStagedBarrier + w, b, head, m0);
    };

    // The dQ partial = dS K over both consumers' dS in dS buffer `buf` and K buffer kbuf, one wgmma batch.
    const auto issue_dq = [&](int buf, int kbuf, FragdQ& acc) {
      warpgroup_mma<size<2>(decltype(tdQrK.layout()){}), true, false>(mma_dq, tdQrdS(_, _, _, buf),
                                                                      tdQrK(_, _, _, kbuf), acc);
    };

    // The dQ product of a turn stays in flight under the statistics and is staged at the next step's start, once
    // that step's partials are in: the other consumer's dK product of the turn's step reads the same dS buffer and
    // is done before that consumer's arrival.
    FragdQ tdQrdQ_flight;  // (MMA, 1, 1) fp32
    int64_t dq_head = 0, dq_m0 = 0;
    int dq_buf = 0;
    auto stage_state = cutlass::PipelineState<Cfg::kStages>{};
    int g = 0;        // the CTA's steps so far: g mod 2 picks the dS buffer and the dQ product's consumer
    int k_loads = 0;  // tiles with steps so far
    KbTileReader<Cfg> tiles(params, st);
    for (KbTile tile; tiles.next(tile);) {
      const KbWork<Cfg> work(params.order, tile);
      const int64_t n0w = work.n0 + int64_t(w) * kHalf;  // this consumer's first key
      const KBufferUse<Cfg> k_use(k_loads);
      clear(tdKrdK);
      StepCursor at = work.first();
      if (work.steps > 0) {
        ++k_loads;
        Cfg::TxBarrier::wait(&st.k_full[k_use.buffer], k_use.phase);
        stage_pipe.consumer_wait(stage_state);  // S of step 0
        FragS tSrS;                             // (MMA, 1, 1) fp32
        stats.issue_s(stage_state.index(), k_use.buffer, tSrS);
        warpgroup_wait<0>();
        warpgroup_fence_operand(tSrS);
        stats.ahead(tSrS, dp_addr, stage_state.index(), int64_t(at.block) * kBlockM, n0w, g);
        stats_arrive(g);
      }
      trace.mark(SpTracePhase::kTileStart);
      // In flight at the top of a step: at most the dQ product of the previous step, where it was this consumer's.
      for (int t = 0; t < work.steps; ++t, ++g) {
        const int stage = stage_state.index(), buf = g % kBuffers;
        const bool turn = !kDqWarpgroup && buf == w;  // the dQ product of step g
        const int64_t head = at.head;
        const int64_t m0 = int64_t(at.block) * kBlockM;
        work.advance(at);
        auto next_state = stage_state;
        ++next_state;
        const bool ahead = t + 1 < work.steps;
        // S(t + 1) at the step's top (the tile's last step's multiplies its own tiles and is never read:
        // straight-line wgmma keeps ptxas from serialising them). Where step g − 1 was this consumer's turn, its
        // dQ partial is staged first: with S(t + 1) in flight, ptxas would serialise the wgmma for the read of the
        // dQ accumulator.
        FragS tSrS;  // (MMA, 1, 1) fp32: S of step t + 1
        const auto issue_next_s = [&] {
          if (ahead) stage_pipe.consumer_wait(next_state);
          stats.issue_s(ahead ? next_state.index() : stage, k_use.buffer, tSrS);
        };
        if (!kDqWarpgroup && t > 0 && !turn) {
          stats_wait(g);
          trace.mark(SpTracePhase::kStatsWait);
          warpgroup_wait<0>();
          warpgroup_fence_operand(tdQrdQ_flight);
          store_dq(tdQrdQ_flight, dq_buf, work.b, dq_head, dq_m0);
          trace.mark(SpTracePhase::kStoreDq);
          issue_next_s();
          trace.mark(SpTracePhase::kIssueS);
        } else {
          issue_next_s();
          trace.mark(SpTracePhase::kIssueS);
          stats_wait(g);
          trace.mark(SpTracePhase::kStatsWait);
        }

        stats.combine(g);
        trace.mark(SpTracePhase::kCombine);
        FragdS tSrdS;  // (MMA, 1, 1)
        stats.ds(tSrdS, m0, n0w);
        trace.mark(SpTracePhase::kDs);
        // dS buffer g mod 2 was last read by step g − 2's products and by the TMA store of that step's dQ partial,
        // staged in it at step g − 1: the dQ product awaited by its consumer at step g − 1's top, the store's read
        // by that consumer's first thread before its arrival at step g − 1's dS barrier (which the other consumer
        // passes), both consumers' dK products of step g − 2 before their statistics' arrivals in that step.
        // With a dQ warpgroup, its product of step g − 2 is what the buffer waits for.
        if constexpr (kDqWarpgroup) {
          if (g >= kBuffers) cutlass::arch::ClusterBarrier::wait(&st.dq.ds_empty[buf], (g / kBuffers - 1) & 1);
        }
        stats.store_ds(tSrdS, ds_addr, buf);
        cutlass::arch::fence_view_async_shared();  // dS written by threads, read by wgmma
        if (!turn) {
          // The previous step's dQ store has read its dS buffer (store_dq).
          if (!kDqWarpgroup && tid == 0) tma_store_wait<0>();
          cutlass::arch::NamedBarrier::arrive(Cfg::kDsBarrierThreads, Cfg::kDsBarrier + buf);
        }
        cutlass::arch::NamedBarrier::sync(Cfg::kWarpgroupThreads, Cfg::kDsOwnBarrier + w);
        trace.mark(SpTracePhase::kStoreDs);
        // dK += dSᵀ Q (this consumer's dS alone), then on its turn, once the other's dS is written, the dQ
        // product: both run under the statistics.
        warpgroup_mma<size<2>(decltype(tdKsdS.layout()){}), false, false>(mma_dk, tdKsdS(_, _, _, buf),
                                                                          tdKsQ(_, _, _, stage), tdKrdK);
        trace.mark(SpTracePhase::kIssueDk);
        // Then S(t + 1) awaited (dK and, on turn, dQ in flight), each wait in the branch of its products so that
        // ptxas sees which accumulator it frees.
        if (turn) {
          cutlass::arch::NamedBarrier::sync(Cfg::kDsBarrierThreads, Cfg::kDsBarrier + buf);
          trace.mark(SpTracePhase::kDsBarrier);
          issue_dq(buf, k_use.buffer, tdQrdQ_flight);
          dq_head = head;
          dq_m0 = m0;
          dq_buf = buf;
          trace.mark(SpTracePhase::kIssueDq);
          warpgroup_wait<2>();
        } else {
          warpgroup_wait<1>();
        }
        trace.mark(SpTracePhase::kWaitProducts);
        warpgroup_fence_operand(tSrS);
        if (ahead) stats.ahead(tSrS, dp_addr, next_state.index(), int64_t(at.block) * kBlockM, n0w, g + 1);
        trace.mark(SpTracePhase::kStats);
        // dK done (its dSᵀ and the stage's Q read) before the arrival, so that the step's partials tell the stager
        // of this step's dQ partial that the dS buffer is read no more; the dQ product stays in flight.
        if (turn) {
          warpgroup_wait<1>();
        } else {
          warpgroup_wait<0>();
        }
        if (ahead) stats_arrive(g + 1);
        trace.mark(SpTracePhase::kWaitDk);
        stage_pipe.consumer_release(stage_state);  // this warpgroup's last reader of the stage is done
        stage_state = next_state;
      }
      // Then this consumer reads the tile's K buffer no more (k_empty counts every consumer thread), its last dQ
      // product awaited and staged once both consumers' dK products of the step, which read the same dS buffer,
      // are done.
      warpgroup_fence_operand(tdKrdK);
      warpgroup_wait<0>();
      if constexpr (!kDqWarpgroup) warpgroup_fence_operand(tdQrdQ_flight);
      if (work.steps > 0) {
        if constexpr (!kDqWarpgroup) {
          cutlass::arch::NamedBarrier::sync(Cfg::kConsumerThreads, Cfg::kTileEndBarrier);
          if ((g - 1) % kBuffers == w) store_dq(tdQrdQ_flight, dq_buf, work.b, dq_head, dq_m0);
        }
        cutlass::arch::ClusterBarrier::arrive(&st.k_empty[k_use.buffer]);
      }
      kb_store_dk<Cfg>(params, w, tdKrdK, thr_dk.partition_C(make_identity_tensor(Shape<HF, HD>{})), work);
      trace.mark(SpTracePhase::kTileEnd);
    }
    if (tid == 0) tma_store_wait<0>();  // the last dQ store reads shared memory until it completes
  }
};

}  // namespace qksoftmax::cuda::sm90
