// The dK warpgroup of the single-pass backward: dK += dSᵀ Q for every step, the CTA's 128 keys × D fp32
// accumulator in its registers for the whole work item, and the epilogue that scales, rounds and stores it.
// One product stays in flight: a stage is released once the product that read it has completed.
#pragma once

#include "cuda/sm90/bwd_config.h"
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
    const int row_blocks = int((prob.Sq + Cfg::kBlockM - 1) / Cfg::kBlockM);
    const int steps = row_blocks * int(prob.group());

    Tensor sdSt = make_tensor(make_smem_ptr(st.dp.data()), typename Cfg::SmemLayoutPt{});  // (BN, BM, ST)
    Tensor sQt = make_tensor(make_smem_ptr(st.q.data()), typename Cfg::SmemLayoutQt{});    // (D, BM, ST)
    typename Cfg::MmadK mma;
    auto thr = mma.get_thread_slice(tid);
    Tensor tdKrdK = partition_fragment_C(mma, Shape<BN, HD>{});  // (MMA, 2, 1) fp32: keys in two halves of 64
    Tensor tdKcdK = thr.partition_C(make_identity_tensor(Shape<BN, HD>{}));  // (MMA, 2, 1) → (n, d)

    // dK += dSᵀ Q of `stage` over the first `halves` 64-key halves, left in flight.
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

    int64_t g0 = 0;
    PersistentScheduler sched(params.work, params.heads, prob.Hk, params.cluster);
    for (WorkItem item; sched.next(item); g0 += steps) {
      clear(tdKrdK);
      mma.accumulate_ = GMMA::ScaleOut::One;
      for (int t = 0; t < steps; ++t) {
        const int64_t g = g0 + t;
        const int stage = int(g % Cfg::kStages);
        Cfg::Barrier::wait(&st.ds_full[stage], uint32_t((g / Cfg::kStages) & 1));
        const int live = mask.live(int64_t(t % row_blocks) * Cfg::kBlockM);
        if (live > 2) {
          issue(stage, Int<2>{});
        } else if (live > 0) {
          issue(stage, Int<1>{});
        } else {
          warpgroup_commit_batch();  // an empty group keeps the count of groups in flight
        }
        warpgroup_wait<1>();  // the previous step's product is done: its stage is free
        if (t > 0) stage_pipe.consumer_release(state_of<StagePipeline>(g - 1));
      }
      warpgroup_wait<0>();
      warpgroup_fence_operand(tdKrdK);
      if (steps > 0) stage_pipe.consumer_release(state_of<StagePipeline>(g0 + steps - 1));
      store(item, mask, tdKrdK, tdKcdK);
    }
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
