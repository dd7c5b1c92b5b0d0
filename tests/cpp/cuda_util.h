// GPU helpers of the tests: whether a GPU exists, device memory, device twins of host tensors.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>

#include "test_util.h"

namespace qksoftmax::test {

constexpr int kPoisonValue = 0xFF;  // cudaMemset's byte: kPoisonByte

inline bool gpu_available() {
  int count = 0;
  const bool available = cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  cudaGetLastError();  // a missing driver or device must not linger as the last error
  return available;
}

// With QKSOFTMAX_REQUIRE_GPU=1 (set by scripts/gpu-check.sh) a missing GPU is a failure, not a skip.
inline bool gpu_required() {
  const char* value = std::getenv("QKSOFTMAX_REQUIRE_GPU");
  return value != nullptr && std::string_view(value) == "1";
}

// With QKSOFTMAX_TEST_SHAPES=small (the sanitizers' run of scripts/gpu-check.sh, where kernels run 10-100x
// slower) the cases whose size serves only volume take a smaller one that crosses the same tile edges: every
// test still runs, every kernel and tail path stays covered.
inline bool small_shapes() {
  const char* value = std::getenv("QKSOFTMAX_TEST_SHAPES");
  return value != nullptr && std::string_view(value) == "small";
}

// Whether the index-th size of an edge list is tried in this dtype (16-bit edge lists): both dtypes at every
// size, or under small shapes one per size, alternating (bf16 at even indices), so each still meets every edge.
inline bool size_takes(DType dtype, size_t index) {
  return !small_shapes() || (dtype == DType::kFloat16) == (index % 2 == 1);
}

// Skips (or, where a GPU is required, fails) the current test when there is no GPU.
#define QKSOFTMAX_NEED_GPU()                                                          \
  do {                                                                                \
    if (!::qksoftmax::test::gpu_available()) {                                        \
      if (::qksoftmax::test::gpu_required()) FAIL() << "QKSOFTMAX_REQUIRE_GPU=1 but no CUDA GPU"; \
      GTEST_SKIP() << "no CUDA GPU";                                                  \
    }                                                                                 \
  } while (false)

// Base of every test that needs a GPU.
class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override { QKSOFTMAX_NEED_GPU(); }
};

inline Status cuda_status(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return {};
  return {Code::kCudaError, std::string(what) + ": " + cudaGetErrorString(err)};
}

// cudaMalloc'd memory (none for 0 bytes), freed on destruction.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes > 0) {
      EXPECT_EQ(cudaMalloc(&ptr_, bytes), cudaSuccess) << "cudaMalloc of " << bytes << " bytes";
    }
  }
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(o.bytes_) {}
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

class Stream {
 public:
  // flags: cudaStreamNonBlocking for a stream that does not wait for the legacy default stream.
  explicit Stream(unsigned flags = cudaStreamDefault) {
    EXPECT_EQ(cudaStreamCreateWithFlags(&stream_, flags), cudaSuccess);
  }
  ~Stream() { cudaStreamDestroy(stream_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

// A host tensor's twin in device memory: the same layout, and at first the same bytes.
class DeviceTensor {
 public:
  explicit DeviceTensor(const HostTensor& host) : host_(&host), buffer_(host.storage().size()) {
    EXPECT_EQ(cudaMemcpy(buffer_.get(), host.storage().data(), buffer_.bytes(), cudaMemcpyHostToDevice), cudaSuccess);
  }
  TensorDesc desc() const { return host_->desc(buffer_.get(), Device::kCUDA); }
  void poison() { EXPECT_EQ(cudaMemset(buffer_.get(), kPoisonValue, buffer_.bytes()), cudaSuccess); }
  // Copies every byte back, padding included, into the host tensor it was made from.
  Status download(HostTensor& host) const {
    EXPECT_EQ(&host, host_);
    return cuda_status(cudaMemcpy(host.storage().data(), buffer_.get(), buffer_.bytes(), cudaMemcpyDeviceToHost),
                       "cudaMemcpy to the host");
  }

 private:
  const HostTensor* host_;
  DeviceBuffer buffer_;
};

// Queries the workspace, allocates it, calls, and waits for the stream. Call is forward or backward.
template <class Args>
Status call_on_gpu(Status (*query)(const Args&, const Options&, size_t*),
                   Status (*call)(const Args&, const Options&, void*, size_t, CUstream_st*), const Args& args,
                   const Options& options, cudaStream_t stream) {
  size_t bytes = 0;
  if (Status s = query(args, options, &bytes); !s.ok()) return s;
  DeviceBuffer workspace(bytes);
  if (Status s = call(args, options, workspace.get(), bytes, stream); !s.ok()) return s;
  return cuda_status(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}

inline Status gpu_forward(const ForwardArgs& args, const Options& options, cudaStream_t stream) {
  return call_on_gpu(&forward_workspace_size, &forward, args, options, stream);
}

inline Status gpu_backward(const BackwardArgs& args, const Options& options, cudaStream_t stream) {
  return call_on_gpu(&backward_workspace_size, &backward, args, options, stream);
}

}  // namespace qksoftmax::test
