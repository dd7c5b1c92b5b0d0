// Host side of the pingpong single pass (sp_pp_config.h): rows of up to 128 keys, recompute mode; the step loads as the key-block pass's (kb_loads), the tile order (kb_scheduler.h, one key block per
// (batch, key head)) and the grid: one persistent CTA per SM, or one per tile where there are fewer. No
// workspace and nothing cleared before it: every dQ row is stored once (by TMA: dQ in its reach), dK once per
// tile.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <string>

#include "cuda/device.h"
#include "cuda/generic_launch.cuh"
#include "cuda/sm90/kb_launch.cuh"
#include "cuda/sm90/sp_pp_config.h"
#include "cuda/sm90/sp_pp_kernel.cuh"

namespace qksoftmax::cuda {

template <class SpCfg>
Status run_sm90_single_pass(const Problem& prob, CUstream_st* stream) {
  constexpr const char* kName = "sm90 single pass";
  if (prob.Sk > SpCfg::kMaxSk) {
    return {Code::kInternal, std::string(kName) + ": rows of more than " + std::to_string(SpCfg::kMaxSk) + " keys"};
  }
  const int64_t steps = (prob.Sq + SpCfg::kBlockM - 1) / SpCfg::kBlockM * prob.group();
  if (steps > INT_MAX) return {Code::kUnsupported, std::string(kName) + ": more than 2^31 - 1 row blocks per head"};
  const int64_t tiles = prob.B * prob.Hk;
  if (tiles > INT_MAX) return {Code::kUnsupported, std::string(kName) + ": more than 2^31 - 1 key heads"};
  const DeviceInfo* device = nullptr;
  if (Status s = device_info(prob.device_index, &device); !s.ok()) return s;
  // (The tiles are dealt statically: the order's sections, which keep a head's key blocks together in L2,
  // change nothing with one key block per head.)
  const int64_t head_bytes = prob.group() * prob.Sq * prob.D * int64_t(sizeof(typename SpCfg::Element));
  using Element = typename SpCfg::Element;
  const int64_t grid = std::min<int64_t>(tiles, int64_t(device->sm_count) * SpCfg::kCtasPerSm);
  const auto dq = cute::make_tensor(
      cute::make_gmem_ptr(static_cast<Element*>(prob.dq.ptr)),
      cute::make_shape(int32_t(prob.Sq), typename SpCfg::HD{}, int32_t(prob.Hq), int32_t(prob.B)),
      cute::make_stride(prob.dq.sr, cute::_1{}, prob.dq.sh, prob.dq.sb));
  const typename SpCfg::Params params{prob, kb_loads<SpCfg>(prob),
                                      make_tma_copy(cute::SM90_TMA_STORE{}, dq, typename SpCfg::SmemLayoutdQ{}),
                                      SpCfg::TileOrder::of(prob, head_bytes)};
  return launch<SpCfg>(sm90::sp_pp_kernel<SpCfg>, kName, grid, params, stream);
}

}  // namespace qksoftmax::cuda
