// Host side of the key-block pass: the step loads, the reduce-add into what the row statistics
// cleared (dQ itself or the fp32 accumulator: DqTarget), the tile order (kb_scheduler.h) and the grid: one
// persistent CTA per SM, or one per tile (a key block of 128 keys of a (batch, key head)) where there are fewer
// tiles. The CTAs take their tiles from the tile counter in the workspace, which the row statistics set to 0
// before: with the tiles handed out as CTAs come free, a grid of one CTA per SM is as even as the tiles allow
// (the order ends with its shortest tiles), whatever their lengths.
// run_sm90_backward (sm90_backward_launch.cuh) calls it after the row statistics.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <string>

#include "cuda/device.h"
#include "cuda/generic_launch.cuh"
#include "cuda/sm90/kb_config.h"
#include "cuda/sm90/kb_kernel.cuh"
#include "cuda/sm90_backward_launch.cuh"

namespace qksoftmax::cuda {

// The TMA descriptors of a key-block step's inputs, each load filling a Q slot, the K tile and a P slot.
template <class KbCfg>
typename KbCfg::Loads kb_loads(const Problem& prob) {
  using namespace cute;
  using KLoad = typename KbCfg::SmemLayoutK;
  using PLoad = decltype(typename KbCfg::SmemLayoutP{}(_, _, 0));
  const auto [q, k, dp, p] = sm90::backward_views<typename KbCfg::Element, typename KbCfg::HD>(prob);
  return {make_tma_copy(SM90_TMA_LOAD{}, q, typename KbCfg::SmemLayoutQ{}(_, _, 0)),
          make_tma_copy(SM90_TMA_LOAD{}, k, KLoad{}), make_tma_copy(SM90_TMA_LOAD{}, dp, PLoad{}),
          make_tma_copy(SM90_TMA_LOAD{}, p, PLoad{})};
}

template <class KbCfg>
Status run_sm90_keyblock(const Problem& prob, const generic::Params& rows, const sm90::DqTarget& target,
                         int* tile_counter, CUstream_st* stream) {
  using namespace cute;
  using DqElement = typename KbCfg::DqElement;
  constexpr const char* kName = "sm90 key-block pass";
  constexpr int64_t e = sizeof(DqElement);
  const int64_t steps = (prob.Sq + KbCfg::kBlockM - 1) / KbCfg::kBlockM * prob.group();
  if (steps > INT_MAX) return {Code::kUnsupported, std::string(kName) + ": more than 2^31 - 1 row blocks per head"};
  const int64_t tiles = (prob.Sk + KbCfg::kBlockN - 1) / KbCfg::kBlockN * prob.B * prob.Hk;
  if (tiles > INT_MAX) return {Code::kUnsupported, std::string(kName) + ": more than 2^31 - 1 key blocks"};
  const DeviceInfo* device = nullptr;
  if (Status s = device_info(prob.device_index, &device); !s.ok()) return s;

  const auto into = make_tensor(make_gmem_ptr(reinterpret_cast<DqElement*>(target.ptr)),
                                make_shape(int32_t(prob.Sq), typename KbCfg::HD{}, int32_t(prob.Hq), int32_t(prob.B)),
                                make_stride(target.sr / e, _1{}, target.sh / e, target.sb / e));
  // What the key blocks of a (batch, key head) share through L2: Q and the dQ target of its query heads.
  const int64_t head_bytes = prob.group() * prob.Sq * prob.D * int64_t(sizeof(typename KbCfg::Element) + e);
  const typename KbCfg::Params params{prob,
                                      kb_loads<KbCfg>(prob),
                                      make_tma_copy(SM90_TMA_REDUCE_ADD{}, into, typename KbCfg::SmemLayoutdQ{}),
                                      rows.lse,
                                      rows.delta,
                                      KbCfg::TileOrder::of(prob, head_bytes),
                                      tile_counter};
  // No more CTAs than tiles: each CTA's first tile is its own index (kb_claimed_tile).
  const int64_t grid = std::min<int64_t>(tiles, int64_t(device->sm_count) * KbCfg::kCtasPerSm);
  return launch<KbCfg>(sm90::kb_kernel<KbCfg>, kName, grid, params, stream);
}

}  // namespace qksoftmax::cuda
