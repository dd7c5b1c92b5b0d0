// The GPU path of a bench built without CUDA (QKSOFTMAX_ENABLE_CUDA off or no nvcc): no GPU is ever found,
// and the CPU backend runs.
#include "paths.h"

namespace qkbench {

int cuda_device_count() { return 0; }

Result run_gpu(const CliOptions&, Report*) {
  return Result("this qksoftmax-bench was built without CUDA: only the CPU backend runs");
}

}  // namespace qkbench
