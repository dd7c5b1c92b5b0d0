// Host side of the generic kernels: workspace layout and the launch sequence of one problem.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <climits>
#include <string>

#include "cuda/cuda_backend.h"
#include "cuda/device.h"
#include "cuda/generic_kernels.cuh"
#include "cuda/tma_encode.h"

namespace qksoftmax::cuda {

// Per-row fp32 vectors the generic path keeps in the workspace, each laid out (B, Hq, Sq).
struct GenericWorkspace {
  bool lse = false;    // LSE computed here (forward without an lse output, recompute without lse)
  bool delta = false;  // D (backward)

  static GenericWorkspace of(const Problem& prob) {
    if (prob.pass == Pass::kForward) return {!prob.out_lse.present(), false};
    return {prob.mode == BackwardMode::kRecompute && !prob.lse.present(), true};
  }
  static size_t vector_bytes(const Problem& prob) {
    const size_t bytes = size_t(prob.B * prob.Hq * prob.Sq) * sizeof(float);
    return (bytes + kWorkspaceAlignment - 1) / kWorkspaceAlignment * kWorkspaceAlignment;
  }
  size_t bytes(const Problem& prob) const { return (int(lse) + int(delta)) * vector_bytes(prob); }
};

inline generic::RowVec contiguous_rows(float* ptr, const Problem& prob) {
  return {ptr, prob.Hq * prob.Sq, prob.Sq, 1};
}
inline generic::RowVec rows_of(const Operand& op) {
  return {static_cast<float*>(op.ptr), op.sb, op.sh, op.sr};
}

inline Status launch_status(const char* kernel) {
  const cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return {};
  return {Code::kCudaError, std::string("launch of ") + kernel + " failed: " + cudaGetErrorString(err)};
}

// The launch configuration of `blocks` blocks of configuration Cfg (threads, shared memory) in thread-block
// clusters of `cluster` consecutive blocks.
template <class Cfg>
struct ClusterLaunch {
  cudaLaunchAttribute attr{};
  cudaLaunchConfig_t config{};

  ClusterLaunch(int64_t blocks, int cluster, CUstream_st* stream) {
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim = {unsigned(cluster), 1, 1};
    config.gridDim = dim3(unsigned(blocks));
    config.blockDim = dim3(Cfg::kThreads);
    config.dynamicSmemBytes = Cfg::kSmemBytes;
    config.stream = stream;
    config.attrs = &attr;
    config.numAttrs = 1;
  }
  ClusterLaunch(const ClusterLaunch&) = delete;  // config points at attr
  ClusterLaunch& operator=(const ClusterLaunch&) = delete;
};

// Clusters of `cluster` CTAs of `kernel` (configuration Cfg) resident at once on the current device, asked once
// per device and cluster size (0: unknown, the caller reports the error in `status`).
template <class Cfg, class Kernel>
int resident_clusters(Kernel kernel, const char* name, int cluster, Status* status) {
  constexpr int kMaxDevices = 64;
  constexpr int kClusterSizes = 5;  // 1, 2, 4, 8, 16
  static std::array<std::atomic<int>, kMaxDevices * kClusterSizes> cache{};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    *status = launch_status(name);
    return 0;
  }
  const size_t slot = size_t(device) * kClusterSizes + size_t(__builtin_ctz(unsigned(cluster)));
  std::atomic<int>* known = device < kMaxDevices ? &cache[slot] : nullptr;  // past kMaxDevices: asked every time
  if (known != nullptr) {
    if (const int clusters = known->load(std::memory_order_relaxed); clusters > 0) return clusters;
  }
  if (Status s = reserve_dynamic_smem(reinterpret_cast<const void*>(kernel), Cfg::kSmemBytes, name); !s.ok()) {
    *status = s;
    return 0;
  }
  const ClusterLaunch<Cfg> launch_config(cluster, cluster, nullptr);
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &launch_config.config) != cudaSuccess || clusters <= 0) {
    cudaGetLastError();
    *status = {Code::kCudaError, std::string(name) + ": no cluster of " + std::to_string(cluster) +
                                     " CTAs fits the device"};
    return 0;
  }
  if (known != nullptr) known->store(clusters, std::memory_order_relaxed);
  return clusters;
}

// Launches a kernel of configuration Cfg (threads, shared memory) with one block per tile, in thread-block
// clusters of `cluster` consecutive blocks when cluster > 1. Launches nothing when a TMA descriptor of its
// parameters failed to encode.
template <class Cfg, class Kernel, class Params>
Status launch(Kernel kernel, const char* name, int64_t tiles, const Params& params, CUstream_st* stream,
              int cluster = 1) {
  if (Status s = take_tma_failure(name); !s.ok()) return s;
  if (tiles > INT_MAX) {
    return {Code::kUnsupported, std::string(name) + ": the problem needs more than 2^31 - 1 blocks"};
  }
  if (Status s = reserve_dynamic_smem(reinterpret_cast<const void*>(kernel), Cfg::kSmemBytes, name); !s.ok()) {
    return s;
  }
  if (cluster == 1) {
    kernel<<<unsigned(tiles), Cfg::kThreads, Cfg::kSmemBytes, stream>>>(params);
    return launch_status(name);
  }
  ClusterLaunch<Cfg> launch_config(tiles, cluster, stream);
  cudaLaunchKernelEx(&launch_config.config, kernel, params);  // its error, if any, is also the last error
  return launch_status(name);
}

// The per-row vectors of a problem: carved from the front of the workspace, or the caller's LSE.
inline generic::Params generic_params(const Problem& prob, void* workspace) {
  const GenericWorkspace ws = GenericWorkspace::of(prob);
  char* cursor = static_cast<char*>(workspace);
  auto take = [&](bool wanted) -> float* {
    if (!wanted) return nullptr;
    float* p = reinterpret_cast<float*>(cursor);
    cursor += GenericWorkspace::vector_bytes(prob);
    return p;
  };
  float* lse_ws = take(ws.lse);
  float* delta_ws = take(ws.delta);

  generic::Params params{prob, {}, {}, false};
  if (prob.pass == Pass::kForward) {
    params.lse = ws.lse ? contiguous_rows(lse_ws, prob) : rows_of(prob.out_lse);
    return params;
  }
  params.delta = contiguous_rows(delta_ws, prob);
  if (prob.mode == BackwardMode::kRecompute) {
    params.lse_given = prob.lse.present();
    params.lse = params.lse_given ? rows_of(prob.lse) : contiguous_rows(lse_ws, prob);
  }
  return params;
}

template <class Cfg>
int64_t row_tiles(const Problem& prob) {
  return (prob.Sq + Cfg::kBlockM - 1) / Cfg::kBlockM * prob.B * prob.Hq;
}

// LSE (unless given) and, in backward, D.
template <class Cfg>
Status run_row_stats(const generic::Params& params, CUstream_st* stream) {
  return launch<Cfg>(generic::row_stats_kernel<Cfg>, "row_stats", row_tiles<Cfg>(params.prob), params, stream);
}

template <class Cfg>
Status run_generic(const Problem& prob, void* workspace, CUstream_st* stream) {
  const generic::Params params = generic_params(prob, workspace);
  if (Status s = run_row_stats<Cfg>(params, stream); !s.ok()) return s;
  if (prob.pass == Pass::kForward) {
    return launch<Cfg>(generic::write_p_kernel<Cfg>, "write_p", row_tiles<Cfg>(prob), params, stream);
  }
  const int64_t col_tiles = (prob.Sk + Cfg::kBlockN - 1) / Cfg::kBlockN * prob.B * prob.Hk;
  if (Status s = launch<Cfg>(generic::dq_kernel<Cfg>, "dq", row_tiles<Cfg>(prob), params, stream); !s.ok()) return s;
  return launch<Cfg>(generic::dk_kernel<Cfg>, "dk", col_tiles, params, stream);
}

}  // namespace qksoftmax::cuda
