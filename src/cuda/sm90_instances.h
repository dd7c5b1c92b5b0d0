// The instantiated Hopper backward configurations: one translation unit each.
#pragma once

#include <cutlass/bfloat16.h>
#include <cutlass/half.h>

#include "problem.h"

struct CUstream_st;

namespace qksoftmax::cuda {

namespace generic {
struct Params;
}  // namespace generic

namespace sm90 {
struct DqTarget;
template <class Element_, int kHeadDim_>
struct Config;
template <class Element_, int kHeadDim_, bool kSavedP_, bool kDirectDq_>
struct KbConfig;
template <class Element_, int kHeadDim_, bool kSavedP_>
struct BwdConfig;
// (dispatched with the dK warpgroup, in one CTA)
template <class Element_, int kHeadDim_, bool kDkWarpgroup_ = true, int kCluster_ = 1, bool kSavedP_ = false>
struct SpPpConfig;
template <class Element_, int kHeadDim_>
struct ForwardConfig;
}  // namespace sm90

template <class Cfg>
Status run_sm90_backward(const Problem& prob, bool direct_dq, void* workspace, CUstream_st* stream);
template <class Cfg>
Status run_sm90_bwd(const Problem& prob, CUstream_st* stream, int64_t repeat = 1);
// Clusters of `cluster` CTAs of the single-pass backward resident at once on the current device (0 on error).
template <class Cfg>
int sm90_bwd_resident_clusters(int cluster);
template <class Cfg>
Status run_sm90_forward(const Problem& prob, CUstream_st* stream);

#define QKSOFTMAX_SM90_CONFIGS(X) \
  X(cutlass::bfloat16_t, 128)     \
  X(cutlass::half_t, 128)

#define QKSOFTMAX_DECLARE_SM90(T, HD) \
  extern template Status run_sm90_backward<sm90::Config<T, HD>>(const Problem&, bool, void*, CUstream_st*);
QKSOFTMAX_SM90_CONFIGS(QKSOFTMAX_DECLARE_SM90)
#undef QKSOFTMAX_DECLARE_SM90

// The key-block pass of the two-pass backward (after the row statistics, which set its tile counter to 0): one
// instantiation per dtype, head dimension, mode, and where dQ is added (straight into dQ, or into the fp32
// accumulator).
template <class KbCfg>
Status run_sm90_keyblock(const Problem& prob, const generic::Params& rows, const sm90::DqTarget& target,
                         int* tile_counter, CUstream_st* stream);
#define QKSOFTMAX_SM90_KB_CONFIGS(X) \
  X(cutlass::bfloat16_t, 128, false) \
  X(cutlass::bfloat16_t, 128, true)  \
  X(cutlass::half_t, 128, false)     \
  X(cutlass::half_t, 128, true)

#define QKSOFTMAX_DECLARE_SM90_KB(T, HD, SAVED_P)                                                               \
  extern template Status run_sm90_keyblock<sm90::KbConfig<T, HD, SAVED_P, true>>(                               \
      const Problem&, const generic::Params&, const sm90::DqTarget&, int*, CUstream_st*);                              \
  extern template Status run_sm90_keyblock<sm90::KbConfig<T, HD, SAVED_P, false>>(                              \
      const Problem&, const generic::Params&, const sm90::DqTarget&, int*, CUstream_st*);
QKSOFTMAX_SM90_KB_CONFIGS(QKSOFTMAX_DECLARE_SM90_KB)
#undef QKSOFTMAX_DECLARE_SM90_KB

// The pingpong single pass (statistics computed in the pass) in clusters of C CTAs, CTA r holding keys
// [128 r, 128 r + 128): rows of up to 128 keys in one CTA, of up to 128·C keys in clusters of C = 2, 4, 8. One
// instantiation per dtype, head dimension (the configurations of the two-pass backward), cluster size and mode,
// each in its own translation unit (sm90_sp_c<C>_<dtype>_hd<D>.cu, sm90_sp_c<C>_<dtype>_savedp_hd<D>.cu).
namespace sm90 {
inline constexpr int64_t kSpBlockM = 64;  // rows per block of the pingpong single pass
inline constexpr int64_t kSpBlockN = 128;  // keys per CTA of the pingpong single pass
}  // namespace sm90
// clear_dq: a cluster's CTAs add the row blocks they share into dQ, whose rows of those blocks the call clears first
// (the step benchmark times the kernel alone); the blocks that key block 0's CTA alone sees are stored.
template <class SpCfg>
Status run_sm90_single_pass(const Problem& prob, CUstream_st* stream, bool clear_dq = true);
// Clusters of the pingpong single pass resident at once on the current device (0 on error).
template <class SpCfg>
int sm90_single_pass_resident_clusters();
#define QKSOFTMAX_SM90_SP_CLUSTERS(X, T, HD) X(T, HD, 1) X(T, HD, 2) X(T, HD, 4) X(T, HD, 8)
#define QKSOFTMAX_DECLARE_SM90_SP_MODE(T, HD, C, SAVED_P)                                                         \
  extern template Status run_sm90_single_pass<sm90::SpPpConfig<T, HD, true, C, SAVED_P>>(const Problem&,         \
                                                                                          CUstream_st*, bool);   \
  extern template int sm90_single_pass_resident_clusters<sm90::SpPpConfig<T, HD, true, C, SAVED_P>>();
#define QKSOFTMAX_DECLARE_SM90_SP_CLUSTER(T, HD, C) \
  QKSOFTMAX_DECLARE_SM90_SP_MODE(T, HD, C, false) QKSOFTMAX_DECLARE_SM90_SP_MODE(T, HD, C, true)
#define QKSOFTMAX_DECLARE_SM90_SP(T, HD) QKSOFTMAX_SM90_SP_CLUSTERS(QKSOFTMAX_DECLARE_SM90_SP_CLUSTER, T, HD)
QKSOFTMAX_SM90_CONFIGS(QKSOFTMAX_DECLARE_SM90_SP)
#undef QKSOFTMAX_DECLARE_SM90_SP
#undef QKSOFTMAX_DECLARE_SM90_SP_CLUSTER
#undef QKSOFTMAX_DECLARE_SM90_SP_MODE

// The single-pass (cluster) backward takes rows of up to this many keys (a portable cluster of 8 CTAs × 128
// keys); the two-pass backward takes longer rows.
inline constexpr int64_t kSm90SinglePassMaxSk = 1024;

// The single-pass backward: one instantiation per dtype, head dimension and mode (saved-P or not).
#define QKSOFTMAX_SM90_BWD_CONFIGS(X) \
  X(cutlass::bfloat16_t, 128, false)  \
  X(cutlass::bfloat16_t, 128, true)   \
  X(cutlass::half_t, 128, false)      \
  X(cutlass::half_t, 128, true)

#define QKSOFTMAX_DECLARE_SM90_BWD(T, HD, SAVED_P)                                                          \
  extern template Status run_sm90_bwd<sm90::BwdConfig<T, HD, SAVED_P>>(const Problem&, CUstream_st*, int64_t); \
  extern template int sm90_bwd_resident_clusters<sm90::BwdConfig<T, HD, SAVED_P>>(int);
QKSOFTMAX_SM90_BWD_CONFIGS(QKSOFTMAX_DECLARE_SM90_BWD)
#undef QKSOFTMAX_DECLARE_SM90_BWD

// The fused forward: one instantiation per dtype and head dimension (the configurations of the two-pass
// backward).
#define QKSOFTMAX_DECLARE_SM90_FORWARD(T, HD) \
  extern template Status run_sm90_forward<sm90::ForwardConfig<T, HD>>(const Problem&, CUstream_st*);
QKSOFTMAX_SM90_CONFIGS(QKSOFTMAX_DECLARE_SM90_FORWARD)
#undef QKSOFTMAX_DECLARE_SM90_FORWARD

}  // namespace qksoftmax::cuda
