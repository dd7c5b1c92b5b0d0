// Host side of the Hopper backward: TMA descriptors, row statistics, dQ accumulator, column pass, dQ scaling.
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <string>
#include <tuple>

#include "cuda/generic_launch.cuh"
#include "cuda/sm90_colpass.cuh"
#include "cuda/sm90_rowstats.cuh"

namespace qksoftmax::cuda {

// Bytes of the fp32 dQ accumulator, (B, Hq, Sq, D).
inline size_t dq_accum_bytes(const Problem& prob) {
  const size_t bytes = size_t(prob.B * prob.Hq * prob.Sq * prob.D) * sizeof(float);
  return (bytes + kWorkspaceAlignment - 1) / kWorkspaceAlignment * kWorkspaceAlignment;
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

// The TMA descriptors of the column pass's step inputs.
template <class Tiles>
typename Tiles::Loads step_loads(const Problem& prob) {
  using namespace cute;
  const auto [q, k, dp, p] = backward_views<typename Tiles::Element, typename Tiles::HD>(prob);
  return {make_tma_copy(SM90_TMA_LOAD{}, q, typename Tiles::SmemLayoutQ{}(_, _, 0)),
          make_tma_copy(SM90_TMA_LOAD{}, k, typename Tiles::SmemLayoutK{}),
          make_tma_copy(SM90_TMA_LOAD{}, dp, typename Tiles::SmemLayoutP{}(_, _, 0)),
          make_tma_copy(SM90_TMA_LOAD{}, p, typename Tiles::SmemLayoutP{}(_, _, 0))};
}

}  // namespace sm90

template <class ColCfg>
Status run_sm90_colpass(const Problem& prob, const generic::Params& rows, float* dq_accum, CUstream_st* stream) {
  using namespace cute;
  constexpr const char* kName = "sm90 column pass";
  constexpr int64_t kHeadDim = ColCfg::kHeadDim;
  const auto accum = make_tensor(make_gmem_ptr(dq_accum),
                                 make_shape(int32_t(prob.Sq), typename ColCfg::HD{}, int32_t(prob.Hq), int32_t(prob.B)),
                                 make_stride(kHeadDim, _1{}, prob.Sq * kHeadDim, prob.Hq * prob.Sq * kHeadDim));
  const typename ColCfg::Params params{
      prob, sm90::step_loads<ColCfg>(prob),
      make_tma_copy(SM90_TMA_REDUCE_ADD{}, accum, typename ColCfg::SmemLayoutdQ{}), rows.lse, rows.delta};
  const int64_t steps = (prob.Sq + ColCfg::kBlockM - 1) / ColCfg::kBlockM * prob.group();
  if (steps > INT_MAX) return {Code::kUnsupported, std::string(kName) + ": more than 2^31 - 1 row blocks per head"};
  const int64_t col_tiles = (prob.Sk + ColCfg::kBlockN - 1) / ColCfg::kBlockN * prob.B * prob.Hk;
  return launch<ColCfg>(sm90::colpass_kernel<ColCfg>, kName, col_tiles, params, stream);
}

template <class Cfg>
Status run_sm90_backward(const Problem& prob, void* workspace, CUstream_st* stream) {
  using namespace cute;
  using Element = typename Cfg::Element;
  using HD = typename Cfg::HD;
  constexpr int kConvertThreads = 256;
  constexpr int64_t kConvertBlocksMax = 4096;

  const generic::Params rows = generic_params(prob, workspace);
  float* dq_accum = reinterpret_cast<float*>(static_cast<char*>(workspace) + GenericWorkspace::of(prob).bytes(prob));
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
      dq_accum};

  const int64_t row_tiles = (prob.Sq + Cfg::kBlockM - 1) / Cfg::kBlockM * prob.B * prob.Hq;
  if (Status s = launch<Cfg>(sm90::rowstats_kernel<Cfg>, "sm90 row statistics", row_tiles, params, stream); !s.ok()) {
    return s;
  }
  // The column pass adds into the accumulator the row statistics cleared; the conversion scales it.
  const Status s = prob.mode == BackwardMode::kSavedP
                       ? run_sm90_colpass<sm90::ColPassConfig<Element, Cfg::kHeadDim, true>>(prob, rows, dq_accum, stream)
                       : run_sm90_colpass<sm90::ColPassConfig<Element, Cfg::kHeadDim, false>>(prob, rows, dq_accum, stream);
  if (!s.ok()) return s;
  const int64_t items = prob.B * prob.Hq * ((prob.Sq + sm90::kConvertItemRows - 1) / sm90::kConvertItemRows);
  const int64_t blocks = std::min<int64_t>(items, kConvertBlocksMax);
  sm90::convert_dq_kernel<Element, Cfg::kHeadDim><<<unsigned(blocks), kConvertThreads, 0, stream>>>(prob, dq_accum);
  return launch_status("convert dq");
}

}  // namespace qksoftmax::cuda
