// Device resources (owning wrappers that report errors as Results) and the data kernels the bench needs.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "model.h"
#include "result.h"

namespace qkbench {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept { *this = std::move(other); }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  ~DeviceBuffer();

  Result allocate(size_t bytes);  // releases what was held first
  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

struct StreamDestroy {
  void operator()(cudaStream_t stream) const { cudaStreamDestroy(stream); }
};
struct CublasDestroy {
  void operator()(cublasHandle_t handle) const { cublasDestroy(handle); }
};
using Stream = std::unique_ptr<CUstream_st, StreamDestroy>;
using Cublas = std::unique_ptr<cublasContext, CublasDestroy>;

Result create_stream(Stream* stream);                        // non-blocking
Result create_cublas(cudaStream_t stream, Cublas* cublas);  // on stream, default math (no TF32 unless asked)

// What the device reports about itself.
struct DeviceInfo {
  std::string name;
  int64_t l2_bytes = 0;
  int sms = 0;
  std::string cuda_runtime;
};

Result device_info(DeviceInfo* info);

// Free device memory in bytes.
Result free_device_bytes(size_t* bytes);

// data[i] ~ N(0, 1) from a counter-based hash of (seed, i), rounded to dtype. Never all zeros.
Result fill_normal(void* data, DType dtype, int64_t n, uint64_t seed, cudaStream_t stream);

// data[i] *= factor (rounded to dtype).
Result scale_in_place(void* data, DType dtype, int64_t n, float factor, cudaStream_t stream);

// L2 ceilings: `passes` reads of bytes at buf (sink: 4 bytes, written practically never), and `passes` rounds of
// fp32 reduce-adds over them; buf 16-byte aligned, bytes a multiple of 16 and well inside L2 (a quarter of it).
Result l2_read(const void* buf, size_t bytes, int passes, void* sink, cudaStream_t stream);
Result l2_reduce(void* buf, size_t bytes, int passes, cudaStream_t stream);

cudaDataType_t cuda_data_type(DType dtype);

}  // namespace qkbench
