// Host side of the single-pass backward: can_implement, the TMA descriptors, the persistent grid (clusters
// that fit the GPU at once, asked of the driver once per device and cluster size) and the launch.
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <string>

#include "cuda/generic_launch.cuh"
#include "cuda/sm90/bwd_config.h"
#include "cuda/sm90/bwd_kernel.cuh"
#include "cuda/sm90_backward_launch.cuh"

namespace qksoftmax::cuda {

namespace sm90 {

// The shapes the single-pass backward takes (given TMA-ready operands, which the dispatch checks).
template <class Cfg>
bool bwd_can_implement(const Problem& prob) {
  const int64_t row_blocks = (prob.Sq + Cfg::kBlockM - 1) / Cfg::kBlockM;
  return prob.pass == Pass::kBackward && prob.dtype == Cfg::kDType && prob.D == Cfg::kHeadDim &&
         (prob.mode == BackwardMode::kSavedP) == Cfg::kSavedP && prob.Sk <= Cfg::kMaxSk &&
         row_blocks * prob.group() <= INT_MAX;
}

template <class Cfg>
typename Cfg::Loads bwd_loads(const Problem& prob) {
  const auto [q, k, dp, p] = backward_views<typename Cfg::Element, typename Cfg::HD>(prob);
  return {make_tma_copy(SM90_TMA_LOAD{}, q, typename Cfg::SmemLayoutQ{}(_, _, 0)),
          make_tma_copy(SM90_TMA_LOAD{}, k, typename Cfg::SmemLayoutKChunk{}),
          make_tma_copy(SM90_TMA_LOAD{}, dp, typename Cfg::SmemLayoutPChunk{}),
          make_tma_copy(SM90_TMA_LOAD{}, p, typename Cfg::SmemLayoutPChunk{})};
}


}  // namespace sm90

// The single-pass backward. `repeat` > 1 walks every (batch, key head) that many times (the step
// micro-benchmark: the same data, resident in L2); results are those of repeat = 1.
template <class Cfg>
Status run_sm90_bwd(const Problem& prob, CUstream_st* stream, int64_t repeat) {
  constexpr const char* kName = "sm90 backward";
  if (!sm90::bwd_can_implement<Cfg>(prob)) {
    return {Code::kUnsupported, std::string(kName) + ": the problem is not one this kernel takes (dtype, head " +
                                    "dimension, mode, at most " + std::to_string(Cfg::kMaxSk) +
                                    " keys, row blocks × group below 2^31)"};
  }
  const int cluster = Cfg::cluster_for(prob.Sk);
  const int64_t heads = prob.B * prob.Hk;
  constexpr int64_t kPair = 2;  // dQ and dK rows take 4-byte stores of two values where aligned
  using Element = typename Cfg::Element;
  const typename Cfg::Params params{prob, sm90::bwd_loads<Cfg>(prob), sm90::aligned_rows<Element>(prob.dq, kPair),
                                    sm90::aligned_rows<Element>(prob.dk, kPair), cluster, heads * repeat, heads};
  if (Status s = take_tma_failure(kName); !s.ok()) return s;  // nothing launched on a descriptor that failed
  Status status;
  const int resident = resident_clusters<Cfg>(sm90::bwd_kernel<Cfg>, "sm90 backward", cluster, &status);
  if (resident == 0) return status;
  const int64_t clusters = std::min<int64_t>(params.work, resident);
  // Always a cluster launch, of one CTA too: the kernel addresses shared memory and barriers through the
  // cluster (resident_clusters reserved the kernel's shared memory).
  ClusterLaunch<Cfg> launch_config(clusters * cluster, cluster, stream);
  cudaLaunchKernelEx(&launch_config.config, sm90::bwd_kernel<Cfg>, params);  // its error is also the last error
  return launch_status(kName);
}

template <class Cfg>
int sm90_bwd_resident_clusters(int cluster) {
  Status status;
  return resident_clusters<Cfg>(sm90::bwd_kernel<Cfg>, "sm90 backward", cluster, &status);
}

}  // namespace qksoftmax::cuda
