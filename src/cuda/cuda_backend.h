// The CUDA backend: kernels for a validated Problem, launched asynchronously on a stream.
#pragma once

#include <cstddef>

#include "problem.h"

namespace qksoftmax::cuda {

// Resolves the device a problem runs on: the one its tensors declare when every tensor declares it (trusted,
// checked against the devices present); otherwise the driver is asked once per distinct pointer, and every
// pointer must be device memory of one device (the declared one, if any). Sets problem->device_index. Never
// synchronises.
Status locate(Problem* problem);

// Makes a device current for the scope's lifetime, restoring the thread's previous context (or none)
// afterwards, and forgets the last CUDA error and the TMA failures left by earlier calls on this thread.
class DeviceScope {
 public:
  DeviceScope() = default;
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

  Status enter(int device);

 private:
  void* previous_context_ = nullptr;  // CUcontext
  bool changed_ = false;
};

// Workspace bytes the problem needs whatever its pointers (a multiple of kWorkspaceAlignment; 0 when none).
size_t workspace_size(const Problem& problem);
// Workspace bytes the kernel that runs a located problem needs: at most workspace_size(problem).
size_t plan_workspace_size(const Problem& problem);

// Runs a located problem on the current device (inside a DeviceScope of its device). Returns kUnsupported
// (having launched nothing) for a device, head dimension or dtype that no kernel covers; kCudaError if a
// launch fails.
Status run(const Problem& problem, void* workspace, CUstream_st* stream);

}  // namespace qksoftmax::cuda
