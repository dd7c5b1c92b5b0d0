// The instantiated Hopper backward configurations: one translation unit each.
#pragma once

#include <cutlass/bfloat16.h>
#include <cutlass/half.h>

#include "problem.h"

struct CUstream_st;

namespace qksoftmax::cuda {

namespace sm90 {
template <class Element_, int kHeadDim_>
struct Config;
template <class Element_, int kHeadDim_, bool kSavedP_>
struct FusedConfig;
template <class Element_, int kHeadDim_>
struct ForwardConfig;
}  // namespace sm90

template <class Cfg>
Status run_sm90_backward(const Problem& prob, void* workspace, CUstream_st* stream);
template <class Cfg>
Status run_sm90_fused(const Problem& prob, CUstream_st* stream);
template <class Cfg>
Status run_sm90_forward(const Problem& prob, CUstream_st* stream);

#define QKSOFTMAX_SM90_CONFIGS(X) \
  X(cutlass::bfloat16_t, 128)     \
  X(cutlass::half_t, 128)

#define QKSOFTMAX_DECLARE_SM90(T, HD) \
  extern template Status run_sm90_backward<sm90::Config<T, HD>>(const Problem&, void*, CUstream_st*);
QKSOFTMAX_SM90_CONFIGS(QKSOFTMAX_DECLARE_SM90)
#undef QKSOFTMAX_DECLARE_SM90

// The fused (cluster) backward takes rows up to this many keys (a portable cluster of 8 CTAs × 128 columns).
inline constexpr int64_t kSm90FusedMaxSk = 1024;

// The fused (cluster) backward: one instantiation per dtype, head dimension and mode (saved-P or not).
#define QKSOFTMAX_SM90_FUSED_CONFIGS(X) \
  X(cutlass::bfloat16_t, 128, false)    \
  X(cutlass::bfloat16_t, 128, true)     \
  X(cutlass::half_t, 128, false)        \
  X(cutlass::half_t, 128, true)

#define QKSOFTMAX_DECLARE_SM90_FUSED(T, HD, SAVED_P) \
  extern template Status run_sm90_fused<sm90::FusedConfig<T, HD, SAVED_P>>(const Problem&, CUstream_st*);
QKSOFTMAX_SM90_FUSED_CONFIGS(QKSOFTMAX_DECLARE_SM90_FUSED)
#undef QKSOFTMAX_DECLARE_SM90_FUSED

// The fused forward: one instantiation per dtype and head dimension (the configurations of the two-pass
// backward).
#define QKSOFTMAX_DECLARE_SM90_FORWARD(T, HD) \
  extern template Status run_sm90_forward<sm90::ForwardConfig<T, HD>>(const Problem&, CUstream_st*);
QKSOFTMAX_SM90_CONFIGS(QKSOFTMAX_DECLARE_SM90_FORWARD)
#undef QKSOFTMAX_DECLARE_SM90_FORWARD

}  // namespace qksoftmax::cuda
