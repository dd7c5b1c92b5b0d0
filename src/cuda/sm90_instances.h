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
}  // namespace sm90

template <class Cfg>
Status run_sm90_backward(const Problem& prob, void* workspace, CUstream_st* stream);

#define QKSOFTMAX_SM90_CONFIGS(X) \
  X(cutlass::bfloat16_t, 128)     \
  X(cutlass::half_t, 128)

#define QKSOFTMAX_DECLARE_SM90(T, HD) \
  extern template Status run_sm90_backward<sm90::Config<T, HD>>(const Problem&, void*, CUstream_st*);
QKSOFTMAX_SM90_CONFIGS(QKSOFTMAX_DECLARE_SM90)
#undef QKSOFTMAX_DECLARE_SM90

}  // namespace qksoftmax::cuda
