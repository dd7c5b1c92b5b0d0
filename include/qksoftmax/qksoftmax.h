// qksoftmax: P = softmax(mask(scale · Q Kᵀ)) and its fused backward (dQ, dK from dP).
//
// Every call validates all of its arguments before touching any output: on error it returns a Status
// with a message and writes nothing. Tensors are described, not owned; the same calls run on host
// pointers (Device::kCPU, the fp64 CPU backend) and on device pointers (Device::kCUDA, asynchronous on
// the given stream, never synchronising the device, never copying between host and device). A CUDA call
// runs on the device of its tensors, whatever device is current in the calling thread, and leaves the
// thread's current CUDA context as it found it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

struct CUstream_st;  // cudaStream_t is CUstream_st*; no CUDA header is needed to use this API.

namespace qksoftmax {

// kFloat64 runs on the CPU backend only (gradient checks in fp64); on Device::kCUDA it is kUnsupported.
enum class DType : uint8_t { kBFloat16, kFloat16, kFloat32, kFloat64 };
enum class Device : uint8_t { kCPU, kCUDA };
enum class Mask : uint8_t { kNone, kCausal };  // kCausal masks j > i (top-left aligned, like torch.tril)
enum class BackwardMode : uint8_t { kRecompute, kSavedP };

inline constexpr int kMaxRank = 4;

// A strided view of memory. Shapes and strides are in elements; strides may be any non-negative value
// (outputs must not overlap themselves). A tensor whose data is null is absent (optional arguments).
//
// device_index is the CUDA device ordinal of a Device::kCUDA tensor, where the caller knows it (a framework's
// tensor does: torch's tensor.device.index, DLPack's device_id). A given index is trusted: the library does
// not ask the driver where the memory lives, and a wrong index is undefined behaviour. With -1 (any
// negative value) the library asks the driver once per distinct pointer of the call (cudaPointerGetAttributes)
// and refuses host memory. The tensors of one call must be on one device. Ignored on Device::kCPU.
struct TensorDesc {
  void* data = nullptr;
  DType dtype = DType::kFloat32;
  Device device = Device::kCPU;
  int device_index = -1;
  int rank = 0;
  int64_t shape[kMaxRank] = {};
  int64_t stride[kMaxRank] = {};

  bool present() const { return data != nullptr; }
};

// q: (B, Hq, Sq, D), k: (B, Hk, Sk, D) with Hq % Hk == 0 (key head of query head h is h / (Hq / Hk)),
// p and dp: (B, Hq, Sq, Sk), lse: (B, Hq, Sq) float32, dq like q, dk like k.
// q, k, p, dp, dq, dk share one dtype. On the CUDA device the last dimension of every tensor must have
// stride 1 (any alignment is accepted; aligned tensors take the fast paths).
struct ForwardArgs {
  TensorDesc q, k;
  TensorDesc p;    // output, dense: masked positions are written as 0
  TensorDesc lse;  // optional output; −inf for a fully masked row
};

struct BackwardArgs {
  TensorDesc q, k, dp;
  TensorDesc p;    // saved-P mode: the probabilities of the forward (required there, absent otherwise)
  TensorDesc lse;  // recompute mode: optional log-sum-exp of the forward (skips the statistics pass)
  TensorDesc dq, dk;  // outputs
};

struct Options {
  std::optional<double> scale;  // default 1/sqrt(D); must be finite
  Mask mask = Mask::kCausal;
  BackwardMode mode = BackwardMode::kRecompute;  // backward only
  bool deterministic = false;  // bitwise-identical results over runs (may cost speed)
};

enum class Code : uint8_t {
  kOk,
  kInvalidArgument,    // shape, dtype, stride, aliasing, device or option is wrong
  kUnsupported,        // valid, but no backend implements it (e.g. a head dimension on CUDA)
  kWorkspaceTooSmall,  // the workspace is smaller than the size query returned, or misaligned
  kCudaError,          // the CUDA runtime reported an error
  kInternal,           // a defect or resource failure inside the library (e.g. host memory exhausted)
};

class Status {
 public:
  Status() = default;
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  Code code_ = Code::kOk;
  std::string message_;
};

// The workspace is caller-provided memory on the tensors' device, aligned to kWorkspaceAlignment bytes,
// at least as large as the size query says. Sizes depend on shapes, dtypes, device and options only. A
// workspace serves one call in flight at a time: calls ordered on one stream may reuse it, calls that may run
// at once (other streams, graphs replayed concurrently) need one each.
inline constexpr size_t kWorkspaceAlignment = 256;

// One call, validated once: made by plan_forward or plan_backward from the call's arguments (every check that
// forward and backward make, and the device the tensors are on), it knows the workspace the call needs and
// runs it without validating again. Knowing where the tensors live, and so which kernel runs, its
// workspace_bytes is what that kernel needs: at most what the size query says, 0 for a call whose kernel
// needs none (the single-pass Hopper backward). A plan holds the tensors' pointers, not their memory: run it while they
// are alive. run may be called more than once, from any thread; each run launches the whole call again.
class Plan {
 public:
  Plan() noexcept;
  ~Plan();
  Plan(Plan&&) noexcept;
  Plan& operator=(Plan&&) noexcept;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;

  bool valid() const { return state_ != nullptr; }  // made by a successful plan_forward / plan_backward
  size_t workspace_bytes() const;                    // 0 for an invalid plan
  Device device() const;
  int device_index() const;  // the CUDA device ordinal the call runs on; -1 on the CPU

  // Launches the call (Device::kCUDA: asynchronously on `stream`, a stream of the plan's device or null for
  // that device's default stream; Device::kCPU: synchronously, the stream ignored). The workspace must be
  // aligned and at least workspace_bytes() large.
  Status run(void* workspace, size_t workspace_bytes, CUstream_st* stream) const;

  struct State;  // opaque: the validated call

 private:
  std::unique_ptr<const State> state_;

  friend Status plan_forward(const ForwardArgs&, const Options&, Plan*);
  friend Status plan_backward(const BackwardArgs&, const Options&, Plan*);
};

// On success *plan holds the call; on error it is left unchanged. Pointer checks (see TensorDesc) are made here.
Status plan_forward(const ForwardArgs& args, const Options& options, Plan* plan);
Status plan_backward(const BackwardArgs& args, const Options& options, Plan* plan);

Status forward_workspace_size(const ForwardArgs& args, const Options& options, size_t* bytes);
// plan_forward, then run; the workspace must be as large as forward_workspace_size says (not only as
// the plan's workspace_bytes), so that whether a call is accepted does not depend on where its tensors live.
Status forward(const ForwardArgs& args, const Options& options, void* workspace, size_t workspace_bytes,
               CUstream_st* stream);

Status backward_workspace_size(const BackwardArgs& args, const Options& options, size_t* bytes);
// plan_backward, then run; the workspace as large as backward_workspace_size says, as for forward.
Status backward(const BackwardArgs& args, const Options& options, void* workspace,
                size_t workspace_bytes, CUstream_st* stream);

// "major.minor.patch"
const char* version();

}  // namespace qksoftmax
