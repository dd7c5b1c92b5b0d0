// The dK warpgroup of the single-pass backward: dK += dSᵀ Q for every step, the CTA's 128 keys × D fp32
// accumulator in its registers for the whole work item, and the epilogue that scales, rounds and stores it.
// A stage is released as soon as the product that read it has completed. In a cluster it is also the
// reducer of dQ: one step behind the softmax warpgroups, it sums the pieces of dQ this CTA owns over the
// cluster's CTAs (in rank order: the same sums every run), scales and stores them.
#pragma once

#include "cuda/sm90/bwd_config.h"
#include "cuda/sm90/cluster_exchange.cuh"
#include "cuda/sm90/mask.h"
#include "cuda/sm90/tile_scheduler.h"

namespace qksoftmax::cuda::sm90 {

template <class Cfg>
struct BwdDk {
  using Element = typename Cfg::Element;
  using BN = typename Cfg::BN;
  using HD = typename Cfg::HD;
  using Mask = ChunkMask<Cfg::kChunk, Cfg::kChunks, Cfg::kBlockM>;
  static constexpr int kChunk = Cfg::kChunk;

  const typename Cfg::Params& params;
  typename Cfg::Storage& st;

  template <class StagePipeline>
  __device__ void run(StagePipeline& stage_pipe, const Mask& mask) {
    const Problem& prob = params.prob;
    const int tid = threadIdx.x % Cfg::kWarpgroupThreads;
    const ItemSteps<Cfg::kBlockM> steps(prob);

    Tensor sdSt = make_tensor(make_smem_ptr(st.dp.data()), typename Cfg::SmemLayoutPt{});  // (BN, BM, ST)
    Tensor sQt = make_tensor(make_smem_ptr(st.q.data()), typename Cfg::SmemLayoutQt{});    // (D, BM, ST)
    typename Cfg::MmadK mma;
    auto thr = mma.get_thread_slice(tid);
    Tensor tdKrdK = partition_fragment_C(mma, Shape<BN, HD>{});  // (MMA, 2, 1) fp32: keys in two halves of 64
    Tensor tdKcdK = thr.partition_C(make_identity_tensor(Shape<BN, HD>{}));  // (MMA, 2, 1) → (n, d)

    // dK += dSᵀ Q of `stage` over the first `halves` 64-key halves.
    const auto issue = [&](int stage, auto halves) {
      Tensor tdKrA = thr.partition_fragment_A(sdSt(_, _, stage));  // (MMA, 2, BM/16) descriptors
      Tensor tdKrB = thr.partition_fragment_B(sQt(_, _, stage));   // (MMA, 1, BM/16) descriptors
      warpgroup_fence_operand(tdKrdK);
      warpgroup_arrive();
      CUTE_UNROLL
      for (int m = 0; m < decltype(halves)::value; ++m) {
        CUTE_UNROLL
        for (int kb = 0; kb < size<2>(tdKrA); ++kb) gemm(mma, tdKrA(_, m, kb), tdKrB(_, 0, kb), tdKrdK(_, m, 0));
      }
      warpgroup_commit_batch();
    };

    const bool reduce = params.cluster > 1;
    int64_t g0 = 0;
    PersistentScheduler sched(params.work, params.heads, prob.Hk, params.cluster);
    for (WorkItem item; sched.next(item); g0 += steps.count) {
      clear(tdKrdK);
      mma.accumulate_ = GMMA::ScaleOut::One;
      for (int t = 0; t < steps.count; ++t) {
        const int64_t g = g0 + t;
        const int stage = int(g % Cfg::kStages);
        Cfg::Barrier::wait(&st.ds_full[stage], uint32_t((g / Cfg::kStages) & 1));
        const int live = mask.live(steps.row0(t));
        if (live > 2) {
          issue(stage, Int<2>{});
        } else if (live > 0) {
          issue(stage, Int<1>{});
        }
        warpgroup_wait<0>();
        warpgroup_fence_operand(tdKrdK);
        stage_pipe.consumer_release(state_of<StagePipeline>(g));
        if (reduce && t > 0) reduce_dq(g - 1, item.b, steps.head(item, t - 1), steps.row0(t - 1), tid);
      }
      const int last = steps.count - 1;
      if (reduce && last >= 0) reduce_dq(g0 + last, item.b, steps.head(item, last), steps.row0(last), tid);
      store(item, mask, tdKrdK, tdKcdK);
    }
  }

  // dQ of global step g (softmax warpgroup g mod 2, its ⌊g / 2⌋-th step; query head h, rows from m0): the
  // pieces this CTA owns, each the sum of every CTA's push in rank order. Frees the slots for the next pushes.
  __device__ void reduce_dq(int64_t g, int64_t b, int64_t h, int64_t m0, int tid) {
    const int w = int(g & 1);
    if (tid == 0) Cfg::TxBarrier::arrive_and_expect_tx(&st.dq_full[w], Cfg::kDqPushBytes);
    Cfg::TxBarrier::wait(&st.dq_full[w], uint32_t((g >> 1) & 1));
    const int cta = int(cute::block_rank_in_cluster());
    const int ctas = cluster_ctas();
    const int log2_ctas = __ffs(ctas) - 1;
    const int pieces = Cfg::kPieces >> log2_ctas;  // owned by each CTA
    const DqRows<Cfg> rows(params.prob, b, h, m0);
    Tensor tdQcdQ = typename Cfg::MmadQ{}.get_thread_slice(tid).partition_C(
        make_identity_tensor(Shape<typename Cfg::BM, HD>{}));  // (MMA, 1, 1) → (m, d)
    for (int j = 0; j < pieces; ++j) {
      const int p = cta + (j << log2_ctas);
      CUTE_UNROLL
      for (int v = 0; v < Cfg::kPieceVectors; ++v) {
        float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (int c = 0; c < ctas; ++c) sum = add_f4(sum, load_shared_f4(smem_addr(&st.dq[w][c * pieces + j][v][tid])));
        rows.store(tdQcdQ, p * Cfg::kPieceValues + 4 * v, sum);
      }
    }
    __syncwarp();  // the slots are read (their values stored): lane c frees them in CTA c
    const int lane = tid % 32;
    Cfg::Barrier::arrive(&st.dq_empty[w], uint32_t(lane), lane < ctas);
  }

  // dK = scale · the accumulator, at the keys of this CTA's chunks below Sk.
  template <class Acc, class Coord>
  __device__ void store(const WorkItem& item, const Mask& mask, const Acc& tdKrdK, const Coord& tdKcdK) const {
    const Problem& prob = params.prob;
    const Operand dk_op = prob.dk;
    const bool vector = aligned_rows<Element>(dk_op, 2);
    Element* dk = static_cast<Element*>(dk_op.ptr) + dk_op.offset(item.b, item.kv_head, 0, 0);
    CUTE_UNROLL
    for (int i = 0; i < size(tdKrdK); i += 2) {  // an accumulator holds pairs of adjacent columns
      const int n = get<0>(tdKcdK(i)), d = get<1>(tdKcdK(i));
      const int64_t key = mask.key0(n / kChunk) + n % kChunk;
      if (key < prob.Sk) store_scaled(dk + key * dk_op.sr + d, tdKrdK(i), tdKrdK(i + 1), prob.scale, vector);
    }
  }
};

}  // namespace qksoftmax::cuda::sm90
