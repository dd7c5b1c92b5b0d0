// Host side of the key-block pass: the step loads, the reduce-add into what the row statistics
// cleared (dQ itself or the fp32 accumulator: DqTarget) and one CTA per key block of 128 keys of each (batch,
// key head). run_sm90_backward (sm90_backward_launch.cuh) calls it after the row statistics.
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <string>

#include "cuda/generic_launch.cuh"
#include "cuda/sm90/kb_config.h"
#include "cuda/sm90/kb_kernel.cuh"
#include "cuda/sm90_backward_launch.cuh"

namespace qksoftmax::cuda {

// The TMA descriptors of a key-block step's inputs.
template <class KbCfg>
typename KbCfg::Loads kb_loads(const Problem& prob) {
  using namespace cute;
  const auto [q, k, dp, p] = sm90::backward_views<typename KbCfg::Element, typename KbCfg::HD>(prob);
  return {make_tma_copy(SM90_TMA_LOAD{}, q, typename KbCfg::SmemLayoutQ{}(_, _, 0)),
          make_tma_copy(SM90_TMA_LOAD{}, k, typename KbCfg::SmemLayoutK{}),
          make_tma_copy(SM90_TMA_LOAD{}, dp, typename KbCfg::SmemLayoutP{}(_, _, 0)),
          make_tma_copy(SM90_TMA_LOAD{}, p, typename KbCfg::SmemLayoutP{}(_, _, 0))};
}

template <class KbCfg>
Status run_sm90_keyblock(const Problem& prob, const generic::Params& rows, const sm90::DqTarget& target,
                         CUstream_st* stream) {
  using namespace cute;
  using DqElement = typename KbCfg::DqElement;
  constexpr const char* kName = "sm90 key-block pass";
  constexpr int64_t e = sizeof(DqElement);
  const auto into = make_tensor(make_gmem_ptr(reinterpret_cast<DqElement*>(target.ptr)),
                                make_shape(int32_t(prob.Sq), typename KbCfg::HD{}, int32_t(prob.Hq), int32_t(prob.B)),
                                make_stride(target.sr / e, _1{}, target.sh / e, target.sb / e));
  const typename KbCfg::Params params{
      prob, kb_loads<KbCfg>(prob),
      make_tma_copy(SM90_TMA_REDUCE_ADD{}, into, typename KbCfg::SmemLayoutdQ{}), rows.lse, rows.delta};
  const int64_t steps = (prob.Sq + KbCfg::kBlockM - 1) / KbCfg::kBlockM * prob.group();
  if (steps > INT_MAX) return {Code::kUnsupported, std::string(kName) + ": more than 2^31 - 1 row blocks per head"};
  const int64_t key_blocks = (prob.Sk + KbCfg::kBlockN - 1) / KbCfg::kBlockN * prob.B * prob.Hk;
  return launch<KbCfg>(sm90::kb_kernel<KbCfg>, kName, key_blocks, params, stream);
}

}  // namespace qksoftmax::cuda
