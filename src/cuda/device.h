// What the CUDA driver says once, cached for every later call: each device's properties and the kernels'
// attributes per device (device.cu). Thread-safe; never synchronises.
#pragma once

#include "problem.h"

namespace qksoftmax::cuda {

struct DeviceInfo {
  int major = 0, minor = 0;  // compute capability
  int sm_count = 0;
  int max_smem_per_block = 0;  // dynamic shared memory a kernel may opt into, bytes
  bool tma = false;            // the Tensor Memory Accelerator (compute capability 9.0 or later)
};

// The properties of CUDA device `device`, asked of the driver on its first use only.
Status device_info(int device, const DeviceInfo** info);

// Lets `kernel` use `bytes` of dynamic shared memory on the current device: cudaFuncSetAttribute once per
// kernel and device, remembered afterwards. `name` names the kernel in an error.
Status reserve_dynamic_smem(const void* kernel, int bytes, const char* name);

// A TMA descriptor that failed to encode on this thread since the last call (tma_encode.h), as the error of
// launching `kernel`, which the caller then does not launch; OK when none failed. Forgets the failure.
Status take_tma_failure(const char* kernel);

}  // namespace qksoftmax::cuda
