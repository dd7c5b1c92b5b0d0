// qksoftmax: P = softmax(mask(scale · Q Kᵀ)) and its fused backward (dQ, dK from dP).
//
// Every call validates all of its arguments before touching any output: on error it returns a Status
// with a message and writes nothing. Tensors are described, not owned; the same calls run on host
// pointers (Device::kCPU, the fp64 CPU backend) and on device pointers (Device::kCUDA, asynchronous on
// the given stream, never synchronising the device).
#pragma once

#include <cstddef>
#include <cstdint>
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
struct TensorDesc {
  void* data = nullptr;
  DType dtype = DType::kFloat32;
  Device device = Device::kCPU;
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
// at least as large as the size query says. Sizes depend on shapes, dtypes, device and options only.
inline constexpr size_t kWorkspaceAlignment = 256;

Status forward_workspace_size(const ForwardArgs& args, const Options& options, size_t* bytes);
Status forward(const ForwardArgs& args, const Options& options, void* workspace, size_t workspace_bytes,
               CUstream_st* stream);

Status backward_workspace_size(const BackwardArgs& args, const Options& options, size_t* bytes);
Status backward(const BackwardArgs& args, const Options& options, void* workspace,
                size_t workspace_bytes, CUstream_st* stream);

// "major.minor.patch"
const char* version();

}  // namespace qksoftmax
