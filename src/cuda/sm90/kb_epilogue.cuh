// The epilogues of the key-block pass: each step's dQ partial (64 rows × D, from the consumer whose turn the
// step was) reduce-added by one TMA from the step's staging buffer into dQ (16 bits) or the fp32
// accumulator (the dQ warp: not deterministic, the adds of different CTAs land in any order), its steps
// counted over all the CTA's tiles so that a tile's last reduce-adds run under the next tile's first steps;
// dK stored by the consumers from their accumulators at each tile's end.
#pragma once

#include <cutlass/arch/barrier.h>

#include "cuda/sm90/kb_config.h"
#include "cuda/sm90/trace.h"

namespace qksoftmax::cuda::sm90 {

// The dQ warp: per step t of the CTA (counted over its tiles, read from the tile ring), once the consumer of its
// turn has written buffer t mod 2 (its full barrier), one thread reduce-adds it; the buffer is handed back (its
// empty barrier) once the reduce-add has read it, awaited a step later so that the two buffers' reduce-adds
// overlap the consumers' work, and announced when step t + 1 comes, which writes it next: a named barrier must
// not be left with arrivals at the kernel's end, and the warp learns that another step follows (of this tile or
// a later one) only when it reaches it.
template <class Cfg>
struct KbDqWriter {
  using BM = typename Cfg::BM;
  using HD = typename Cfg::HD;
  const typename Cfg::Params& params;
  typename Cfg::Storage& st;

  __device__ void run(int lane) {
    const Problem& prob = params.prob;
    constexpr int kBuffers = Cfg::kBuffers;
    Tensor mdQ = params.tma_dq.get_tma_tensor(make_shape(int32_t(prob.Sq), HD{}, int32_t(prob.Hq), int32_t(prob.B)));
    int t = 0;  // the CTA's steps so far
    typename Cfg::Trace trace(KbTraceRole::kDq, true);
    KbTileReader<Cfg> tiles(params, st);
    for (KbTile tile; tiles.next(tile);) {
      const KbWork<Cfg> work(params.order, tile);
      StepCursor at = work.first();
      for (int i = 0; i < work.steps; ++i, ++t) {
        const int buf = t % kBuffers;
        const int64_t h = at.head;
        const int mb = at.block;
        work.advance(at);
        // The reduce-add of step t − 2 read buffer buf (its wait ended step t − 1): step t may write it.
        if (t >= kBuffers) cutlass::arch::NamedBarrier::arrive(Cfg::kDqBarrierThreads, Cfg::kDqEmptyBarrier + buf);
        cutlass::arch::NamedBarrier::sync(Cfg::kDqBarrierThreads, Cfg::kDqFullBarrier + buf);
        trace.mark(KbTracePhase::kDqFullWait);
        if (lane == 0) {
          Tensor sdQ = make_tensor(make_smem_ptr(st.dq[buf].data()), typename Cfg::SmemLayoutdQ{});  // (BM, D)
          Tensor gdQ = local_tile(mdQ(_, _, h, work.b), Shape<BM, HD>{}, make_coord(mb, 0));           // (BM, D)
          tma_store_tile(params.tma_dq, sdQ, gdQ);
          tma_store_arrive();
          tma_store_wait<1>();  // the reduce-add of step t − 1 has read its buffer
        }
        __syncwarp();
        trace.mark(KbTracePhase::kReduceAdd);
      }
    }
    if (lane == 0) tma_store_wait<0>();  // the reduce-adds read shared memory until they complete
  }
};

// What the dQ partials and dK take after their products: where dS carries the scale (kScaleInDs), nothing, or a
// negation in recompute, whose dS carries |scale| (KbRows), where the scale is negative; otherwise the scale.
enum class KbFinish { kNone, kNegate, kScale };

// Calls f(std::integral_constant<KbFinish, ...>{}): the stores compiled once per case, so that no value pays a
// select or a multiply it does not need.
template <class Cfg, class F>
__device__ inline void with_kb_finish(const Problem& prob, F&& f) {
  if constexpr (!kScaleInDs<typename Cfg::Element>) {
    f(std::integral_constant<KbFinish, KbFinish::kScale>{});
  } else if (!Cfg::kSavedP && prob.scale < 0.0f) {
    f(std::integral_constant<KbFinish, KbFinish::kNegate>{});
  } else {
    f(std::integral_constant<KbFinish, KbFinish::kNone>{});
  }
}

template <KbFinish kFinish>
__device__ inline float kb_finish(float x, float scale) {
  return kFinish == KbFinish::kNone ? x : kFinish == KbFinish::kNegate ? -x : x * scale;
}

// dK of a tile = the accumulator of consumer w (its kKeys keys), finished (KbFinish), at its keys below Sk (zeros for
// a block without steps); on the GPU the last dimension has stride 1 (validate.cpp).
template <class Cfg, int kKeys = Cfg::kHalf, class Acc, class Coord>
__device__ void kb_store_dk(const typename Cfg::Params& params, int w, const Acc& tdKrdK, const Coord& tdKcdK,
                            const KbWork<Cfg>& work) {
  using Element = typename Cfg::Element;
  const Problem& prob = params.prob;
  const Operand dk_op = prob.dk;
  const bool vector = aligned_rows<Element>(dk_op, 2);
  const int64_t key0 = work.n0 + int64_t(w) * kKeys;
  Element* dk = static_cast<Element*>(dk_op.ptr) + dk_op.offset(work.b, work.kv_head, key0, 0);
  // Compiled for each case: where every key of the block is below Sk and a pair takes one 4-byte store (the
  // common case), without a check or a branch per pair (they were half of the epilogue's instructions); and per
  // KbFinish.
  const auto store = [&](auto whole, auto finish) {
    constexpr KbFinish kFinish = decltype(finish)::value;
    CUTE_UNROLL
    for (int i = 0; i < size(tdKrdK); i += 2) {  // an accumulator holds pairs of adjacent columns
      const int c = get<0>(tdKcdK(i)), d = get<1>(tdKcdK(i));
      const float x = kb_finish<kFinish>(tdKrdK(i), prob.scale), y = kb_finish<kFinish>(tdKrdK(i + 1), prob.scale);
      if (whole || key0 + c < prob.Sk) store_converted(dk + c * dk_op.sr + d, x, y, whole || vector);
    }
  };
  const bool whole = vector && key0 + kKeys <= prob.Sk;
  with_kb_finish<Cfg>(prob, [&](auto finish) {
    if (whole) {
      store(std::true_type{}, finish);
    } else {
      store(std::false_type{}, finish);
    }
  });
}

}  // namespace qksoftmax::cuda::sm90
