// The public entry points: a plan validates a call once (arguments, then where its pointers live) and knows its
// workspace; running it checks the workspace and dispatches on the call's own device. forward and backward are
// a plan and its run.
#include <cstdint>
#include <exception>
#include <memory>
#include <string>

#include "cpu/cpu_backend.h"
#include "cuda/cuda_backend.h"
#include "qksoftmax/qksoftmax.h"
#include "validate.h"

namespace qksoftmax {

struct Plan::State {
  Problem problem;
  size_t workspace = 0;
};

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
Status make_plan(const Args& args, const Options& options, std::unique_ptr<const Plan::State>* out) {
  if (out == nullptr) return {Code::kInvalidArgument, "plan: expected a Plan to fill, got null"};
  auto state = std::make_unique<Plan::State>();
  if (Status s = make_problem(args, options, &state->problem); !s.ok()) return s;
  if (state->problem.device == Device::kCUDA) {
    if (Status s = cuda::locate(&state->problem); !s.ok()) return s;
  }
  // The plan knows where the tensors live: the workspace of the kernel that runs them.
  state->workspace = state->problem.device == Device::kCUDA ? cuda::plan_workspace_size(state->problem) : 0;
  *out = std::move(state);
  return {};
}

Status run_problem(const Problem& problem, void* workspace, CUstream_st* stream) {
  if (problem.device == Device::kCPU) return cpu::run(problem);
  cuda::DeviceScope scope;
  if (Status s = scope.enter(problem.device_index); !s.ok()) return s;
  return cuda::run(problem, workspace, stream);
}

// forward and backward hold the workspace to what the size query returns for the same arguments, though the
// kernel that runs may need less (a plan's workspace_bytes): whether a call is accepted must not depend on
// where its tensors happen to live.
template <class Args>
Status run_once(const Args& args, const Options& options, void* workspace, size_t workspace_bytes,
                CUstream_st* stream) {
  return guarded([&]() -> Status {
    std::unique_ptr<const Plan::State> state;
    if (Status s = make_plan(args, options, &state); !s.ok()) return s;
    if (Status s = check_workspace(workspace, workspace_bytes, required_workspace(state->problem)); !s.ok()) {
      return s;
    }
    return run_problem(state->problem, workspace, stream);
  });
}

}  // namespace

Plan::Plan() noexcept = default;
Plan::~Plan() = default;
Plan::Plan(Plan&&) noexcept = default;
Plan& Plan::operator=(Plan&&) noexcept = default;

size_t Plan::workspace_bytes() const { return state_ ? state_->workspace : 0; }
Device Plan::device() const { return state_ ? state_->problem.device : Device::kCPU; }
int Plan::device_index() const {
  return state_ && state_->problem.device == Device::kCUDA ? state_->problem.device_index : -1;
}

Status Plan::run(void* workspace, size_t workspace_bytes, CUstream_st* stream) const {
  return guarded([&]() -> Status {
    if (!state_) return {Code::kInvalidArgument, "plan: expected a plan made by plan_forward or plan_backward"};
    if (Status s = check_workspace(workspace, workspace_bytes, state_->workspace); !s.ok()) return s;
    return run_problem(state_->problem, workspace, stream);
  });
}

Status plan_forward(const ForwardArgs& args, const Options& options, Plan* plan) {
  return guarded([&] { return make_plan(args, options, plan ? &plan->state_ : nullptr); });
}

Status plan_backward(const BackwardArgs& args, const Options& options, Plan* plan) {
  return guarded([&] { return make_plan(args, options, plan ? &plan->state_ : nullptr); });
}

Status forward_workspace_size(const ForwardArgs& args, const Options& options, size_t* bytes) {
  return workspace_size(args, options, bytes);
}

Status forward(const ForwardArgs& args, const Options& options, void* workspace, size_t workspace_bytes,
               CUstream_st* stream) {
  return run_once(args, options, workspace, workspace_bytes, stream);
}

Status backward_workspace_size(const BackwardArgs& args, const Options& options, size_t* bytes) {
  return workspace_size(args, options, bytes);
}

Status backward(const BackwardArgs& args, const Options& options, void* workspace, size_t workspace_bytes,
                CUstream_st* stream) {
  return run_once(args, options, workspace, workspace_bytes, stream);
}

const char* version() { return QKSOFTMAX_VERSION; }

}  // namespace qksoftmax
