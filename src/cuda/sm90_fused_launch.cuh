// Host side of the Hopper fused backward: TMA descriptors and the cluster launch.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "cuda/generic_launch.cuh"
#include "cuda/sm90_backward_launch.cuh"
#include "cuda/sm90_fused.cuh"

namespace qksoftmax::cuda {

template <class Cfg>
Status run_sm90_fused(const Problem& prob, CUstream_st* stream) {
  using namespace cute;
  using Element = typename Cfg::Element;
  using HD = typename Cfg::HD;
  constexpr const char* kName = "sm90 fused backward";

  const int cluster = Cfg::cluster_for(prob.Sk);
  const auto [q, k, dp, p] = sm90::backward_views<Element, HD>(prob);
  const typename Cfg::Params params{
      prob,
      make_tma_copy(SM90_TMA_LOAD{}, q, typename Cfg::SmemLayoutQ{}(_, _, 0)),
      make_tma_copy(SM90_TMA_LOAD{}, k, typename Cfg::SmemLayoutK{}),
      make_tma_copy(SM90_TMA_LOAD{}, dp, typename Cfg::SmemLayoutP{}(_, _, 0)),
      make_tma_copy(SM90_TMA_LOAD{}, p, typename Cfg::SmemLayoutP{}(_, _, 0)),
      cluster,
      Cfg::kHeadDim / cluster};

  const int64_t blocks = int64_t(cluster) * prob.B * prob.Hk;
  if (blocks > INT_MAX) return {Code::kUnsupported, std::string(kName) + ": more than 2^31 - 1 blocks"};
  const int64_t steps = (prob.Sq + Cfg::kBlockM - 1) / Cfg::kBlockM * prob.group();
  if (steps > INT_MAX) return {Code::kUnsupported, std::string(kName) + ": more than 2^31 - 1 row blocks per head"};
  const auto kernel = sm90::fused_backward_kernel<Cfg>;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes) != cudaSuccess) {
    return launch_status(kName);
  }
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = unsigned(cluster);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(unsigned(blocks));
  config.blockDim = dim3(Cfg::kThreads);
  config.dynamicSmemBytes = Cfg::kSmemBytes;
  config.stream = stream;
  config.attrs = attr;
  config.numAttrs = 1;
  if (cudaLaunchKernelEx(&config, kernel, params) != cudaSuccess) return launch_status(kName);
  return launch_status(kName);
}

}  // namespace qksoftmax::cuda
