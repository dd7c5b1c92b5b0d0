// Host side of the Hopper two-pass backward: TMA descriptors, row statistics, key-block pass (sm90/kb_launch.cuh),
// and where dQ is added through the fp32 accumulator its conversion.
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <string>
#include <tuple>

#include "cuda/generic_launch.cuh"
#include "cuda/sm90_convert.cuh"
#include "cuda/sm90_instances.h"
#include "cuda/sm90_rowstats.cuh"

namespace qksoftmax::cuda {

// Bytes of the fp32 dQ accumulator, (B, Hq, Sq, D).
inline size_t dq_accum_bytes(const Problem& prob) {
  const size_t bytes = size_t(prob.B * prob.Hq * prob.Sq * prob.D) * sizeof(float);
  return (bytes + kWorkspaceAlignment - 1) / kWorkspaceAlignment * kWorkspaceAlignment;
}

// The key-block pass's tile counter (sm90/kb_scheduler.h), one int32 of the workspace, which serves one call
// in flight at a time (qksoftmax.h). It takes a whole alignment unit, so that the accumulator after it stays
// aligned.
inline constexpr size_t kKbTileCounterBytes = kWorkspaceAlignment;

// The two-pass backward's workspace: the generic row vectors (LSE, D), the tile counter, and the fp32
// accumulator where dQ is not added straight into dQ.
inline size_t sm90_backward_workspace_bytes(const Problem& prob, bool direct_dq) {
  return GenericWorkspace::of(prob).bytes(prob) + kKbTileCounterBytes + (direct_dq ? 0 : dq_accum_bytes(prob));
}

namespace sm90 {

// A (rows, d, head, batch) or (rows, cols, head, batch) view of an operand, as its TMA descriptor sees it.
template <class Element, class Cols>
auto tma_view(const Operand& op, int64_t rows, Cols cols, int64_t heads, int64_t batch) {
  return cute::make_tensor(cute::make_gmem_ptr(static_cast<const Element*>(op.ptr)),
                     cute::make_shape(int32_t(rows), cols, int32_t(heads), int32_t(batch)),
                     cute::make_stride(op.sr, cute::_1{}, op.sh, op.sb));
}

// The backward's inputs as TMA sees them: q, k, dp, and p (dp again when absent: its descriptor is then
// built but never used).
template <class Element, class HD>
auto backward_views(const Problem& prob) {
  return std::make_tuple(tma_view<Element>(prob.q, prob.Sq, HD{}, prob.Hq, prob.B),
                         tma_view<Element>(prob.k, prob.Sk, HD{}, prob.Hk, prob.B),
                         tma_view<Element>(prob.dp, prob.Sq, int32_t(prob.Sk), prob.Hq, prob.B),
                         tma_view<Element>(prob.p.present() ? prob.p : prob.dp, prob.Sq, int32_t(prob.Sk), prob.Hq,
                                           prob.B));
}

}  // namespace sm90

// What the key-block pass adds its dQ partials into, as DqTarget (byte strides) for the row statistics to clear:
// dQ itself (direct) or the fp32 accumulator, (B, Hq, Sq, D), contiguous.
template <class Element>
sm90::DqTarget dq_target(const Problem& prob, bool direct, float* dq_accum) {
  constexpr int64_t kVector = 16;
  if (direct) {
    const int64_t e = sizeof(Element);
    return {static_cast<char*>(prob.dq.ptr), prob.dq.sb * e, prob.dq.sh * e, prob.dq.sr * e, int(prob.D * e / kVector)};
  }
  const int64_t row = prob.D * int64_t(sizeof(float));
  return {reinterpret_cast<char*>(dq_accum), prob.Hq * prob.Sq * row, prob.Sq * row, row, int(row / kVector)};
}

template <class Cfg>
Status run_sm90_backward(const Problem& prob, bool direct_dq, void* workspace, CUstream_st* stream) {
  using namespace cute;
  using Element = typename Cfg::Element;
  using HD = typename Cfg::HD;
  constexpr int kConvertThreads = 256;
  constexpr int64_t kConvertBlocksMax = 4096;

  const generic::Params rows = generic_params(prob, workspace);
  char* const past_rows = static_cast<char*>(workspace) + GenericWorkspace::of(prob).bytes(prob);
  int* const tile_counter = reinterpret_cast<int*>(past_rows);
  float* const dq_accum = reinterpret_cast<float*>(past_rows + kKbTileCounterBytes);
  const auto [q, k, dp, p] = sm90::backward_views<Element, HD>(prob);
  const typename Cfg::Params params{
      prob,
      make_tma_copy(SM90_TMA_LOAD{}, q, typename Cfg::SmemLayoutQ{}),
      make_tma_copy(SM90_TMA_LOAD{}, k, typename Cfg::SmemLayoutK{}(_, _, 0)),
      make_tma_copy(SM90_TMA_LOAD{}, dp, typename Cfg::SmemLayoutP{}(_, _, 0)),
      make_tma_copy(SM90_TMA_LOAD{}, p, typename Cfg::SmemLayoutP{}(_, _, 0)),
      rows.lse,
      rows.delta,
      rows.lse_given,
      dq_target<Element>(prob, direct_dq, dq_accum),
      tile_counter};

  const int64_t row_tiles = (prob.Sq + Cfg::kBlockM - 1) / Cfg::kBlockM * prob.B * prob.Hq;
  if (Status s = launch<Cfg>(sm90::rowstats_kernel<Cfg>, "sm90 row statistics", row_tiles, params, stream); !s.ok()) {
    return s;
  }
  // The key-block pass adds its partials into what the row statistics cleared and takes its tiles from the
  // counter they set to 0 (kernels of one stream run in order: no memset, no synchronisation); where dQ went into
  // the accumulator, the conversion stores it into dQ.
  constexpr int kD = Cfg::kHeadDim;
  const bool saved_p = prob.mode == BackwardMode::kSavedP;
  const sm90::DqTarget& target = params.dq_clear;
  using sm90::KbConfig;  // (incomplete here: its kernels are instantiated in sm90_kb_*.cu)
  const Status s =
      direct_dq
          ? (saved_p ? run_sm90_keyblock<KbConfig<Element, kD, true, true>>(prob, rows, target, tile_counter, stream)
                     : run_sm90_keyblock<KbConfig<Element, kD, false, true>>(prob, rows, target, tile_counter, stream))
          : (saved_p ? run_sm90_keyblock<KbConfig<Element, kD, true, false>>(prob, rows, target, tile_counter, stream)
                     : run_sm90_keyblock<KbConfig<Element, kD, false, false>>(prob, rows, target, tile_counter, stream));
  if (!s.ok() || direct_dq) return s;
  const int64_t items = prob.B * prob.Hq * ((prob.Sq + sm90::kConvertItemRows - 1) / sm90::kConvertItemRows);
  const int64_t blocks = std::min<int64_t>(items, kConvertBlocksMax);
  sm90::convert_dq_kernel<Element, Cfg::kHeadDim><<<unsigned(blocks), kConvertThreads, 0, stream>>>(prob, dq_accum);
  return launch_status("convert dq");
}

}  // namespace qksoftmax::cuda
