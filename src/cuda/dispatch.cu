// The CUDA backend's entry points: workspace size and the choice of kernel family.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "cuda/cuda_backend.h"
#include "cuda/device.h"
#include "cuda/generic_instances.h"
#include "cuda/generic_launch.cuh"
#include "cuda/sm90_backward_launch.cuh"
#include "cuda/sm90/kb_scheduler.h"
#include "cuda/sm90_instances.h"
#include "cuda/tma_reach.h"

namespace qksoftmax::cuda {
namespace {

constexpr int kHopperMajor = 9;
constexpr int64_t kSm90HeadDim = 128;

// Backward shapes of the Hopper kernels, whatever the pointers.
bool sm90_backward_shape(const Problem& prob) {
  return prob.pass == Pass::kBackward && prob.dtype != DType::kFloat32 && prob.D == kSm90HeadDim;
}
// The row-block single pass (sm90/bwd_config.h, given TMA-ready tensors) sums in a fixed order: it serves the
// deterministic calls of up to kSm90SinglePassMaxSk keys that the pingpong single pass (sm90_sp_cluster) does not
// take, and the rows that one CTA holds which that pass leaves (few long tiles) (H200, seed16 bf16, 2026-12-01:
// 0.65-0.82x the two-pass time at S = 128, 0.92-1.09x at 256 and 1.4-2.4x at 512 and 1024 in clusters of 4 and
// 8 CTAs); longer rows take the two-pass backward.
constexpr int64_t kSm90SinglePassDefaultMaxSk = 128;
bool sm90_single_pass_fits(const Problem& prob) {
  return prob.Sk <= (prob.deterministic ? kSm90SinglePassMaxSk : kSm90SinglePassDefaultMaxSk);
}
// The shapes the two-pass Hopper backward may take (rows past the single pass; its dQ atomics reorder sums:
// not when deterministic); the workspace size depends on this only.
bool sm90_shape(const Problem& prob) {
  return sm90_backward_shape(prob) && !prob.deterministic && !sm90_single_pass_fits(prob);
}

// The fused forward: 16-bit, D = 128, q, k and p in TMA reach (P is stored by TMA), and P's rows a whole number
// of 16-byte units: a TMA store clips a row at 16-byte granularity (on the H200, P rows of 63 keys in rows
// padded to 64 had the padding written).
bool sm90_forward_eligible(const Problem& prob) {
  const size_t e = dtype_size(prob.dtype);
  return prob.pass == Pass::kForward && prob.dtype != DType::kFloat32 && prob.D == kSm90HeadDim &&
         (prob.Sk * int64_t(e)) % kTmaAlignmentBytes == 0 && tma_compatible(prob.q, e) &&
         tma_compatible(prob.k, e) && tma_compatible(prob.out_p, e);
}

bool sm90_tma_ready(const Problem& prob) {
  const size_t e = dtype_size(prob.dtype);
  return sm90_backward_shape(prob) && tma_compatible(prob.q, e) && tma_compatible(prob.k, e) &&
         tma_compatible(prob.dp, e) && (!prob.p.present() || tma_compatible(prob.p, e));
}

// The backward that run gives the single pass (whatever it then finds, it launches nothing else).
bool sm90_single_pass(const Problem& prob) { return sm90_tma_ready(prob) && sm90_single_pass_fits(prob); }

// The pingpong single pass (sm90/sp_pp_config.h) takes rows of up to 1024 keys with dQ in TMA's reach, recompute
// (a given LSE is not read: the pass computes its own statistics, as it must for D anyway) or saved-P, in clusters of
// C = 1, 2, 4 or 8 CTAs, CTA r holding keys [128 r, 128 r + 128) of a (batch, key head): rows of up to 128, 129
// to 256, 385 to 512 and 897 to 1024 keys (other lengths: the two-pass backward). A cluster's CTAs add their dQ
// parts into dQ in the order they finish: the same sum in either order for two parts added into zero, so only
// clusters of up to 2 serve deterministic calls. It is taken where its tiles, one cluster per (batch, key head),
// fill the GPU or are short: with fewer CTAs than SMs and more than kSm90SpMaxSteps steps a tile, the row-block
// tiles of the other backward kernels spread the work wider. Returns the cluster size, or 0 where not taken.
// The largest clusters taken, by mask (H200, seed16 bf16, recompute, against the two-pass backward in the same
// call): causal rows, in mirrored pairs of heads (KbTileOrder::pair_heads), 8: B8·S512 525.8 / 520.7 µs against
// 584.4 / 588.1, B8·S1024 1693.7 / 1694.0 against 1808.3 / 1718.3 (2026-12-03, two rounds each), B1·S1024 226.8 /
// 228.0 against 245.3 / 243.0 (2026-12-04, bench/results/h200-v53-ab.log); unmasked rows, 8 (S = 1024 at B 1 / 2 /
// 4 / 8: 357.8 / 689.5 / 1320.3 / 2589.2 µs against 358.4 / 693.6 / 1357.5 / 3015.5).
// (Measured in recompute; saved-P takes the same clusters.) QKSOFTMAX_SM90_SP_MAX_CLUSTER, where defined, takes the
// place of both limits (an A/B build's knob).
#ifdef QKSOFTMAX_SM90_SP_MAX_CLUSTER
constexpr int kSm90SpMaxClusterCausal = QKSOFTMAX_SM90_SP_MAX_CLUSTER;
constexpr int kSm90SpMaxClusterFull = QKSOFTMAX_SM90_SP_MAX_CLUSTER;
#else
constexpr int kSm90SpMaxClusterCausal = 8;
constexpr int kSm90SpMaxClusterFull = 8;
#endif
constexpr int64_t kSm90SpMaxSteps = 64;
constexpr int kSm90SpDeterministicMaxCluster = 2;
int sm90_sp_cluster(const Problem& prob, int sms) {
  if (prob.Sk > kSm90SinglePassMaxSk) return 0;
  if (!tma_compatible(prob.dq, dtype_size(prob.dtype))) return 0;  // dQ stored (or added) by TMA
  const int64_t cluster = (prob.Sk + sm90::kSpBlockN - 1) / sm90::kSpBlockN;
  if (cluster & (cluster - 1)) return 0;  // 3, 5, 6, 7: not instantiated
  if (cluster > (prob.mask == Mask::kCausal ? kSm90SpMaxClusterCausal : kSm90SpMaxClusterFull)) return 0;
  // Causal clusters of 4 and 8 pay only with heads in pairs (one at a time they lost to the two passes: B8·S512 598.8
  // against 572.3 µs, B8·S1024 2358.6 against 1754.5), which the parities of some Sq < Sk shapes rule out.
  using SpOrder = sm90::KbTileOrder<int(sm90::kSpBlockM), int(sm90::kSpBlockN)>;  // (SpPpConfig::TileOrder)
  if (prob.mask == Mask::kCausal && cluster > 2 && !SpOrder::of(prob, 1).pairable()) return 0;
  if (prob.deterministic && cluster > kSm90SpDeterministicMaxCluster) return 0;
  const int64_t steps = (prob.Sq + sm90::kSpBlockM - 1) / sm90::kSpBlockM * prob.group();
  return prob.B * prob.Hk * cluster >= sms || steps <= kSm90SpMaxSteps ? int(cluster) : 0;
}

template <class T, int HD, bool kSavedP>
Status run_sm90_sp(const Problem& prob, int cluster, CUstream_st* stream) {
  switch (cluster) {
#define QKSOFTMAX_SM90_SP_CASE(T_, HD_, C) \
    case C:                                 \
      return run_sm90_single_pass<sm90::SpPpConfig<T_, HD_, true, C, kSavedP>>(prob, stream);
    QKSOFTMAX_SM90_SP_CLUSTERS(QKSOFTMAX_SM90_SP_CASE, T, HD)
#undef QKSOFTMAX_SM90_SP_CASE
  }
  return {Code::kInternal, "sm90 single pass: no clusters of " + std::to_string(cluster) + " CTAs"};
}

// The two-pass backward adds its dQ partials (one per 128-key column block) straight into dQ, carrying the
// scale (KbFinish) and rounded to 16 bits, where dQ is in TMA's reach and a row has at most kSm90DirectDqMaxSk
// keys: then the sums of at most 8 rounded partials stay well inside the accuracy bar (scripts/dq_rounding.py,
// S = 1024, causal, N(0, 1) inputs: bf16 2.5e-3, fp16 3.1e-4 of relative error from rounding the partials and
// their sums, against 1.7e-3 and 2.1e-4 from rounding the output alone). Longer rows go through the fp32
// accumulator.
constexpr int64_t kSm90DirectDqMaxSk = 1024;
bool sm90_direct_dq(const Problem& prob) {
  return prob.Sk <= kSm90DirectDqMaxSk && tma_compatible(prob.dq, dtype_size(prob.dtype));
}


}  // namespace

size_t workspace_size(const Problem& prob) {
  return sm90_shape(prob) ? sm90_backward_workspace_bytes(prob, false) : GenericWorkspace::of(prob).bytes(prob);
}

size_t plan_workspace_size(const Problem& prob) {
  if (sm90_single_pass(prob)) return 0;  // it keeps everything on chip
  if (sm90_shape(prob) && sm90_tma_ready(prob) && sm90_direct_dq(prob)) {
    return sm90_backward_workspace_bytes(prob, true);  // no accumulator
  }
  return workspace_size(prob);
}

Status run(const Problem& prob, void* workspace, CUstream_st* stream) {
  const DeviceInfo* device = nullptr;
  if (Status s = device_info(prob.device_index, &device); !s.ok()) return s;
  if (device->major != kHopperMajor) {
    return {Code::kUnsupported, "q: the CUDA backend is built for Hopper (sm_90a) only; use the CPU backend"};
  }
  if (sm90_forward_eligible(prob)) {
#define QKSOFTMAX_DISPATCH_SM90_FORWARD(T, HD)                                         \
    if (prob.dtype == ElementTraits<T>::kDType && prob.D == HD) {                      \
      return run_sm90_forward<sm90::ForwardConfig<T, HD>>(prob, stream);             \
    }
    QKSOFTMAX_SM90_CONFIGS(QKSOFTMAX_DISPATCH_SM90_FORWARD)
#undef QKSOFTMAX_DISPATCH_SM90_FORWARD
  }
  if (const int cluster = sm90_tma_ready(prob) ? sm90_sp_cluster(prob, device->sm_count) : 0; cluster > 0) {
#define QKSOFTMAX_DISPATCH_SM90_SP(T, HD)                                               \
    if (prob.dtype == ElementTraits<T>::kDType && prob.D == HD) {                      \
      return prob.mode == BackwardMode::kSavedP ? run_sm90_sp<T, HD, true>(prob, cluster, stream)    \
                                                : run_sm90_sp<T, HD, false>(prob, cluster, stream);  \
    }
    QKSOFTMAX_SM90_CONFIGS(QKSOFTMAX_DISPATCH_SM90_SP)
#undef QKSOFTMAX_DISPATCH_SM90_SP
  }
  if (sm90_single_pass(prob)) {
    const bool saved_p = prob.mode == BackwardMode::kSavedP;
#define QKSOFTMAX_DISPATCH_SM90_BWD(T, HD, SAVED_P)                                     \
    if (prob.dtype == ElementTraits<T>::kDType && prob.D == HD && saved_p == SAVED_P) { \
      return run_sm90_bwd<sm90::BwdConfig<T, HD, SAVED_P>>(prob, stream);              \
    }
    QKSOFTMAX_SM90_BWD_CONFIGS(QKSOFTMAX_DISPATCH_SM90_BWD)
#undef QKSOFTMAX_DISPATCH_SM90_BWD
  }
  if (sm90_tma_ready(prob) && !prob.deterministic) {
#define QKSOFTMAX_DISPATCH_SM90(T, HD)                                                 \
    if (prob.dtype == ElementTraits<T>::kDType && prob.D == HD) {                      \
      return run_sm90_backward<sm90::Config<T, HD>>(prob, sm90_direct_dq(prob), workspace, stream); \
    }
    QKSOFTMAX_SM90_CONFIGS(QKSOFTMAX_DISPATCH_SM90)
#undef QKSOFTMAX_DISPATCH_SM90
  }
#define QKSOFTMAX_DISPATCH_GENERIC(T, HD)                                              \
  if (prob.dtype == ElementTraits<T>::kDType && prob.D == HD) {                        \
    return run_generic<GenericConfig<T, HD>>(prob, workspace, stream);                 \
  }
  QKSOFTMAX_GENERIC_CONFIGS(QKSOFTMAX_DISPATCH_GENERIC)
#undef QKSOFTMAX_DISPATCH_GENERIC
  return {Code::kUnsupported, "q: the CUDA backend supports head dimensions 64 and 128, got " +
                                  std::to_string(prob.D) + " (the CPU backend supports any)"};
}

}  // namespace qksoftmax::cuda
