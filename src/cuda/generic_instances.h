// The instantiated generic configurations: one translation unit each (generic_<dtype>_hd<D>.cu).
#pragma once

#include "cuda/generic_config.h"
#include "problem.h"

struct CUstream_st;

namespace qksoftmax::cuda {

template <class Cfg>
Status run_generic(const Problem& prob, void* workspace, CUstream_st* stream);

#define QKSOFTMAX_GENERIC_CONFIGS(X) \
  X(cutlass::bfloat16_t, 64)         \
  X(cutlass::bfloat16_t, 128)        \
  X(cutlass::half_t, 64)             \
  X(cutlass::half_t, 128)            \
  X(float, 64)                       \
  X(float, 128)

#define QKSOFTMAX_DECLARE_GENERIC(T, D) \
  extern template Status run_generic<GenericConfig<T, D>>(const Problem&, void*, CUstream_st*);
QKSOFTMAX_GENERIC_CONFIGS(QKSOFTMAX_DECLARE_GENERIC)
#undef QKSOFTMAX_DECLARE_GENERIC

}  // namespace qksoftmax::cuda
