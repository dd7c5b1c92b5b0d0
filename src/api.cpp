// The public entry points: validate, check what only the device can tell, check the workspace, dispatch.
#include <cstdint>
#include <exception>
#include <string>

#include "cpu/cpu_backend.h"
#include "cuda/cuda_backend.h"
#include "qksoftmax/qksoftmax.h"
#include "validate.h"

namespace qksoftmax {
namespace {

size_t required_workspace(const Problem& problem) {
  return problem.device == Device::kCUDA ? cuda::workspace_size(problem) : 0;  // the CPU backend needs none
}

Status check_workspace(const void* workspace, size_t bytes, size_t required) {
  const uintptr_t misalignment = reinterpret_cast<uintptr_t>(workspace) % kWorkspaceAlignment;
  if (misalignment != 0) {
    return {Code::kWorkspaceTooSmall, "workspace: expected a pointer aligned to " +
                                          std::to_string(kWorkspaceAlignment) + " bytes, got one " +
                                          std::to_string(misalignment) + " bytes past that"};
  }
  if (bytes < required || (required > 0 && workspace == nullptr)) {
    return {Code::kWorkspaceTooSmall, "workspace: expected at least " + std::to_string(required) +
                                          " bytes (as the size query returns), got " +
                                          (workspace ? std::to_string(bytes) + " bytes" : "a null pointer")};
  }
  return {};
}

// Errors are values: nothing escapes the API, not even an allocation failure while building a message.
template <class Body>
Status guarded(const Body& body) noexcept {
  try {
    return body();
  } catch (const std::exception& e) {
    return {Code::kInternal, std::string("internal error: ") + e.what()};
  } catch (...) {
    return {Code::kInternal, "internal error"};
  }
}

template <class Args>
Status workspace_size(const Args& args, const Options& options, size_t* bytes) {
  return guarded([&]() -> Status {
    if (bytes == nullptr) return {Code::kInvalidArgument, "bytes: expected a pointer to write the size to, got null"};
    Problem problem;
    if (Status s = make_problem(args, options, &problem); !s.ok()) return s;
    *bytes = required_workspace(problem);
    return {};
  });
}

template <class Args>
Status run(const Args& args, const Options& options, void* workspace, size_t workspace_bytes,
           CUstream_st* stream) {
  return guarded([&]() -> Status {
    Problem problem;
    if (Status s = make_problem(args, options, &problem); !s.ok()) return s;
    if (problem.device == Device::kCUDA) {
      if (Status s = cuda::check_pointers(problem); !s.ok()) return s;
    }
    if (Status s = check_workspace(workspace, workspace_bytes, required_workspace(problem)); !s.ok()) return s;
    return problem.device == Device::kCUDA ? cuda::run(problem, workspace, stream) : cpu::run(problem);
  });
}

}  // namespace

Status forward_workspace_size(const ForwardArgs& args, const Options& options, size_t* bytes) {
  return workspace_size(args, options, bytes);
}

Status forward(const ForwardArgs& args, const Options& options, void* workspace, size_t workspace_bytes,
               CUstream_st* stream) {
  return run(args, options, workspace, workspace_bytes, stream);
}

Status backward_workspace_size(const BackwardArgs& args, const Options& options, size_t* bytes) {
  return workspace_size(args, options, bytes);
}

Status backward(const BackwardArgs& args, const Options& options, void* workspace, size_t workspace_bytes,
                CUstream_st* stream) {
  return run(args, options, workspace, workspace_bytes, stream);
}

const char* version() { return QKSOFTMAX_VERSION; }

}  // namespace qksoftmax
