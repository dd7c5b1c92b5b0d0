// The dQ epilogue of the single-pass backward in a cluster: warps 1-3 of the producer warpgroup sum, for every
// step, the pieces of dQ this CTA owns over the cluster's CTAs (in rank order: the same sums every run), scale,
// round and store them, then free the slots in every sender. (dK is stored by the consumers at the end of a
// work item, from their accumulators.)
#pragma once

#include "cuda/sm90/bwd_config.h"
#include "cuda/sm90/cluster_exchange.cuh"
#include "cuda/sm90/tile_scheduler.h"
#include "cuda/sm90/trace.h"

namespace qksoftmax::cuda::sm90 {

template <class Cfg>
struct BwdDqReducer {
  const typename Cfg::Params& params;
  typename Cfg::Storage& st;

  // rtid: this thread among the reducer warps. Output i of a step is (owned piece k, vector v of the piece,
  // pushing consumer thread t), i = (k · kPieceVectors + v) · 128 + t: consecutive threads read consecutive
  // 16-byte slots.
  __device__ void run(int rtid, const typename Cfg::Mask& mask) {
    const Problem& prob = params.prob;
    const int lane = rtid % 32;
    const int cta = mask.rank;
    const int ctas = mask.cluster;
    const int log2_ctas = mask.log2_cluster;
    const int owned = Cfg::kPieces >> log2_ctas;  // pieces each CTA owns
    constexpr int kThreads = Cfg::kWarpgroupThreads;
    constexpr int kSlotVectors = Cfg::kPieceVectors * kThreads;
    const int outputs = owned * kSlotVectors;
    const ItemSteps<Cfg::kBlockM> steps(prob);
    typename Cfg::Trace trace(TraceRole::kReducer, rtid < 32);

    int64_t g = 0;
    PersistentScheduler sched(params.work, params.heads, prob.Hk, ctas);
    for (WorkItem item; sched.next(item);) {
      for (int t = 0; t < steps.count; ++t, ++g) {
        const int buf = int(g & 1);
        if (rtid == 0) Cfg::TxBarrier::arrive_and_expect_tx(&st.dq_full[buf], Cfg::kDqPushBytes);
        const int64_t h = steps.head(item, t), m0 = steps.row0(t);
        const DqRows<Cfg> rows(params, item.b, h, m0, 0);
        const uint32_t slots = smem_addr(&st.dq[buf][0][0][0]);
        Cfg::TxBarrier::wait(&st.dq_full[buf], uint32_t((g >> 1) & 1));
        trace.mark(TracePhase::kDqFullWait);
        for (int i = rtid; i < outputs; i += Cfg::kReducerThreads) {
          const int k = i / kSlotVectors;          // owned piece
          const int v = (i / kThreads) % Cfg::kPieceVectors;
          const int sender = i % kThreads;        // the consumer thread that pushed it
          const int p = cta + (k << log2_ctas);    // its piece of dQ
          // Slot (c, k) of each sender c, in rank order; unrolled, so that the loads need not wait on the adds.
          float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
          CUTE_UNROLL
          for (int c = 0; c < Cfg::kMaxCluster; ++c) {
            if (c < ctas) sum = add_f4(sum, load_shared_f4(slots + uint32_t(c * owned * kSlotVectors + i) * sizeof(float4)));
          }
          // Piece p is values [8 (p mod 4), +8) of consumer ⌊p / 4⌋'s accumulator, whose columns start at 64 ⌊p / 4⌋.
          const int consumer = p / Cfg::kPiecesPerConsumer;
          const int e = (p % Cfg::kPiecesPerConsumer) * Cfg::kPieceValues + 4 * v;
          DqRows<Cfg> half = rows;
          half.rows += consumer * Cfg::kHalf;
          half.store(sender, e, sum);
        }
        __syncwarp();  // the slots are read (their values stored): lane c frees them in CTA c
        Cfg::Barrier::arrive(&st.dq_empty[buf], uint32_t(lane), lane < ctas);
        trace.mark(TracePhase::kReduce);
      }
    }
  }
};

}  // namespace qksoftmax::cuda::sm90
