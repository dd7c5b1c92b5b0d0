// The Hopper backward for float16, head dimension 128.
#include "cuda/sm90_backward_launch.cuh"
#include "cuda/sm90_instances.h"

namespace qksoftmax::cuda {
template Status run_sm90_backward<sm90::Config<cutlass::half_t, 128>>(const Problem&, bool, void*, CUstream_st*);
}  // namespace qksoftmax::cuda
