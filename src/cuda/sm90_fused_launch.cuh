// Host side of the Hopper fused backward: TMA descriptors and the launch in clusters.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "cuda/generic_launch.cuh"
#include "cuda/sm90_backward_launch.cuh"
#include "cuda/sm90_fused.cuh"

namespace qksoftmax::cuda {

template <class Cfg>
Status run_sm90_fused(const Problem& prob, CUstream_st* stream) {
  constexpr const char* kName = "sm90 fused backward";
  const int cluster = Cfg::cluster_for(prob.Sk);
  const typename Cfg::Params params{prob, sm90::step_loads<Cfg>(prob), cluster, Cfg::kHeadDim / cluster};

  const int64_t steps = (prob.Sq + Cfg::kBlockM - 1) / Cfg::kBlockM * prob.group();
  if (steps > INT_MAX) return {Code::kUnsupported, std::string(kName) + ": more than 2^31 - 1 row blocks per head"};
  return launch<Cfg>(sm90::fused_backward_kernel<Cfg>, kName, int64_t(cluster) * prob.B * prob.Hk, params, stream,
                     cluster);
}

}  // namespace qksoftmax::cuda
