// Host side of the pingpong single pass (sp_pp_config.h): rows of up to 128 keys (one CTA) or 128·C (clusters of
// C CTAs), recompute or saved-P mode (an instance each); the step loads as the key-block pass's (kb_loads), the
// tile order (kb_scheduler.h: a (batch, key head)'s key blocks consecutive, one per CTA of its cluster; causal
// heads in mirrored pairs) and the grid: one persistent CTA per SM (or as many clusters as fit at once), or one per tile (pair) where there are fewer.
// No workspace. One CTA stores every dQ row once (by TMA: dQ in its reach); in a cluster the row blocks that the
// CTA of key block 0 alone sees are stored by it, the others added by each CTA into dQ cleared first
// (sp_clear_dq_kernel). dK is stored once per tile: by TMA where the dK warpgroup holds it and dK is in TMA's reach,
// from registers otherwise.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <string>

#include "cuda/device.h"
#include "cuda/generic_launch.cuh"
#include "cuda/sm90/kb_launch.cuh"
#include "cuda/sm90/sp_pp_config.h"
#include "cuda/sm90/sp_pp_kernel.cuh"
#include "cuda/tma_reach.h"

namespace qksoftmax::cuda {

namespace sm90 {
// Causal heads in mirrored pairs (KbTileOrder::pair_heads); QKSOFTMAX_SM90_SP_NO_PAIRS, an A/B build's knob, takes
// them one at a time.
#ifdef QKSOFTMAX_SM90_SP_NO_PAIRS
constexpr bool kSm90SpPairs = false;
#else
constexpr bool kSm90SpPairs = true;
#endif

// dQ's rows [first_row, sq) of every (batch, query head) cleared (as dq_target gives them, kHeadDim 16-bit values
// in 16-byte vectors): the rows of the blocks that the CTAs of a cluster share, which they add into
// (SpPpConfig::shared_block); the others are stored.
template <class Element, int kHeadDim>
__global__ void sp_clear_dq_kernel(DqTarget dq, int64_t hq, int64_t sq, int64_t first_row, int64_t rows) {
  constexpr int kVectors = kHeadDim * int(sizeof(Element)) / int(sizeof(uint4));
  const int64_t per_head = sq - first_row;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < rows * kVectors; i += stride) {
    const int64_t r = i / kVectors, head = r / per_head;
    dq.row(head / hq, head % hq, first_row + r % per_head)[i % kVectors] = make_uint4(0, 0, 0, 0);
  }
}
constexpr int kClearThreads = 256;
constexpr int kClearBlocksPerSm = 4;
}  // namespace sm90

template <class SpCfg>
Status run_sm90_single_pass(const Problem& prob, CUstream_st* stream, [[maybe_unused]] bool clear_dq) {
  constexpr const char* kName = "sm90 single pass";
  if (prob.dtype != SpCfg::kDType) return {Code::kInternal, std::string(kName) + ": an instance of another dtype"};
  if ((prob.mode == BackwardMode::kSavedP) != SpCfg::kSavedP || (SpCfg::kSavedP && !prob.p.present())) {
    return {Code::kInternal, std::string(kName) + ": an instance of the other mode"};
  }
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
  // A gradient as its TMA stores see it: (rows, d, head, batch).
  const auto gradient = [&](const Operand& op, int64_t rows, int64_t heads) {
    return cute::make_tensor(cute::make_gmem_ptr(static_cast<Element*>(op.ptr)),
                             cute::make_shape(int32_t(rows), typename SpCfg::HD{}, int32_t(heads), int32_t(prob.B)),
                             cute::make_stride(op.sr, cute::_1{}, op.sh, op.sb));
  };
  const auto dq = gradient(prob.dq, prob.Sq, prob.Hq);
  constexpr int kCluster = SpCfg::kCluster;
  typename SpCfg::Params params{prob,
                                kb_loads<SpCfg>(prob),
                                make_tma_copy(cute::SM90_TMA_STORE{}, dq, typename SpCfg::SmemLayoutdQ{}),
                                typename SpCfg::TmaAddedQ{},
                                SpCfg::TileOrder::of(prob, head_bytes),
                                typename SpCfg::TmaStoredK{},
                                false};
  if constexpr (sm90::kSm90SpDiag) {
    const char* diag = std::getenv("QKSOFTMAX_SM90_SP_DIAG");
    params.diag = diag != nullptr ? std::atoi(diag) : 0;
  }
  if (SpCfg::kDkWarpgroup && sm90::kSm90SpDkByTma && tma_compatible(prob.dk, sizeof(Element))) {
    params.tma_dk =
        make_tma_copy(cute::SM90_TMA_STORE{}, gradient(prob.dk, prob.Sk, prob.Hk), typename SpCfg::SmemLayoutK{});
    params.dk_by_tma = true;
  }
  if constexpr (kCluster == 1) {
    const int64_t grid = std::min<int64_t>(tiles, int64_t(device->sm_count) * SpCfg::kCtasPerSm);
    return launch<SpCfg>(sm90::sp_pp_kernel<SpCfg>, kName, grid, params, stream);
  } else {
    if (params.order.key_blocks != kCluster) {
      return {Code::kInternal, std::string(kName) + ": a cluster of " + std::to_string(kCluster) +
                                   " CTAs for rows of " + std::to_string(prob.Sk) + " keys"};
    }
    // The cluster of tile indices [C i, C i + C) takes head i; causal heads in mirrored pairs (KbTileOrder::
    // pair_heads), where the CTAs' parities allow it.
    params.order.by_head();
    if (sm90::kSm90SpPairs && SpCfg::kPairs && prob.keys().causal && params.order.pairable()) params.order.pair_heads();
    const int64_t cluster_tiles = params.order.paired ? (tiles + 1) / 2 : tiles;
    params.tma_dq_add = make_tma_copy(cute::SM90_TMA_REDUCE_ADD{}, dq, typename SpCfg::SmemLayoutdQ{});
    if (Status s = take_tma_failure(kName); !s.ok()) return s;  // (before dQ is cleared: nothing written)
    Status status;
    const int resident = resident_clusters<SpCfg>(sm90::sp_pp_kernel<SpCfg>, kName, kCluster, &status);
    if (resident == 0) return status;
    const int64_t first_row = std::min<int64_t>(prob.Sq, int64_t(params.order.first_row_block(1)) * SpCfg::kBlockM);
    const int64_t rows = prob.B * prob.Hq * (prob.Sq - first_row);  // in the blocks that CTAs share
    if (clear_dq && rows > 0) {
      const sm90::DqTarget target = dq_target<Element>(prob, true, nullptr);
      const int64_t clear_blocks = std::min<int64_t>((rows * target.row_vectors + sm90::kClearThreads - 1) /
                                                         sm90::kClearThreads,
                                                     int64_t(device->sm_count) * sm90::kClearBlocksPerSm);
      sm90::sp_clear_dq_kernel<Element, SpCfg::kHeadDim>
          <<<unsigned(clear_blocks), sm90::kClearThreads, 0, stream>>>(target, prob.Hq, prob.Sq, first_row, rows);
      if (Status s = launch_status("sm90 single pass (dQ cleared)"); !s.ok()) return s;
    }
    return launch<SpCfg>(sm90::sp_pp_kernel<SpCfg>, kName, std::min<int64_t>(cluster_tiles, resident) * kCluster,
                         params, stream, kCluster);
  }
}

template <class SpCfg>
int sm90_single_pass_resident_clusters() {
  Status status;
  return resident_clusters<SpCfg>(sm90::sp_pp_kernel<SpCfg>, "sm90 single pass", SpCfg::kCluster, &status);
}

}  // namespace qksoftmax::cuda
