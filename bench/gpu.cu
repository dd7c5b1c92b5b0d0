#include <algorithm>

#include "cuda_check.h"
#include "device_types.cuh"
#include "gpu.h"
#include "paths.h"

namespace qkbench {
namespace {

constexpr int kThreads = 256;
constexpr int kBlocksPerSm = 16;
constexpr int kDefaultSms = 132;
constexpr float kTwoToMinus24 = 5.9604644775390625e-08f;
constexpr int kUniformBits = 24;
constexpr uint64_t kUniformMask = (uint64_t(1) << kUniformBits) - 1;

__device__ uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Box–Muller on two 24-bit uniforms in (0, 1).
__device__ float normal_at(uint64_t seed, uint64_t i) {
  const uint64_t h = splitmix64(seed ^ splitmix64(i));
  const float u1 = (float(h & kUniformMask) + 0.5f) * kTwoToMinus24;
  const float u2 = (float((h >> kUniformBits) & kUniformMask) + 0.5f) * kTwoToMinus24;
  return sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
}

template <typename T>
__global__ void fill_normal_kernel(T* data, int64_t n, uint64_t seed) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    data[i] = from_float<T>(normal_at(seed, uint64_t(i)));
}

template <typename T>
__global__ void scale_kernel(T* data, int64_t n, float factor) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    data[i] = from_float<T>(to_float(data[i]) * factor);
}

// `passes` reads of buf (16-byte loads that skip L1, kL2Loads independent ones in flight per thread), folded into
// one word per thread so that the loads stay; the word is stored only if it takes one value out of 2^32.
constexpr int kL2Loads = 4;
__global__ void l2_read_kernel(const uint4* buf, int64_t n, int passes, uint32_t* sink) {
  constexpr uint32_t kUnlikely = 0x9E3779B9u;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  uint32_t fold[kL2Loads] = {};
  for (int p = 0; p < passes; ++p) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += kL2Loads * stride) {
      uint4 v[kL2Loads];
#pragma unroll
      for (int k = 0; k < kL2Loads; ++k) v[k] = i + k * stride < n ? __ldcg(buf + i + k * stride) : uint4{};
#pragma unroll
      for (int k = 0; k < kL2Loads; ++k) fold[k] ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
    }
  }
  uint32_t all = 0;
#pragma unroll
  for (int k = 0; k < kL2Loads; ++k) all ^= fold[k];
  if (all == kUnlikely) *sink = all;
}

// `passes` rounds of per-thread 16-byte fp32 reduce-adds (red.global.add.v4.f32) over buf.
__global__ void l2_reduce_kernel(float4* buf, int64_t n, int passes) {
  for (int p = 0; p < passes; ++p) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
      atomicAdd(buf + i, make_float4(1.0f, 1.0f, 1.0f, 1.0f));
  }
}

int device_sms() {
  static const int sms = [] {
    int device = 0, count = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
      return kDefaultSms;
    return count;
  }();
  return sms;
}

// Blocks of kThreads for n elements, at most `per_sm` per SM.
int grid_for(int64_t n, int per_sm = kBlocksPerSm) {
  const int64_t needed = (n + kThreads - 1) / kThreads;
  return int(std::max<int64_t>(1, std::min<int64_t>(needed, int64_t(device_sms()) * per_sm)));
}

}  // namespace

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  std::swap(ptr_, other.ptr_);
  std::swap(bytes_, other.bytes_);
  return *this;
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_) cudaFree(ptr_);
}

Result DeviceBuffer::allocate(size_t bytes) {
  if (ptr_) QKB_CUDA(cudaFree(ptr_));
  ptr_ = nullptr;
  bytes_ = 0;
  if (bytes == 0) return {};
  QKB_TRY(cuda_result(cudaMalloc(&ptr_, bytes), ("cudaMalloc of " + std::to_string(bytes) + " bytes").c_str()));
  bytes_ = bytes;
  return {};
}

Result create_stream(Stream* stream) {
  cudaStream_t s = nullptr;
  QKB_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  stream->reset(s);
  return {};
}

Result create_cublas(cudaStream_t stream, Cublas* cublas) {
  cublasHandle_t h = nullptr;
  QKB_CUBLAS(cublasCreate(&h));
  cublas->reset(h);
  QKB_CUBLAS(cublasSetStream(h, stream));
  // Plain fp32 GEMMs stay fp32: TF32 only where a call asks for it through its compute type.
  QKB_CUBLAS(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));
  return {};
}

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return count;
}

Result device_info(DeviceInfo* info) {
  int device = 0, runtime = 0;
  cudaDeviceProp prop{};
  QKB_CUDA(cudaGetDevice(&device));
  QKB_CUDA(cudaGetDeviceProperties(&prop, device));
  QKB_CUDA(cudaRuntimeGetVersion(&runtime));
  constexpr int kMajorDivisor = 1000, kMinorDivisor = 10, kMinorModulo = 100;
  info->name = prop.name;
  info->l2_bytes = prop.l2CacheSize;
  info->sms = prop.multiProcessorCount;
  info->cuda_runtime = std::to_string(runtime / kMajorDivisor) + "." +
                       std::to_string((runtime % kMinorModulo) / kMinorDivisor);
  return {};
}

Result free_device_bytes(size_t* bytes) {
  size_t total = 0;
  return cuda_result(cudaMemGetInfo(bytes, &total), "cudaMemGetInfo");
}

Result fill_normal(void* data, DType dtype, int64_t n, uint64_t seed, cudaStream_t stream) {
  return launch_for_dtype(dtype, "fill_normal_kernel", [&](auto tag) {
    using T = decltype(tag);
    fill_normal_kernel<T><<<grid_for(n), kThreads, 0, stream>>>(static_cast<T*>(data), n, seed);
  });
}

Result scale_in_place(void* data, DType dtype, int64_t n, float factor, cudaStream_t stream) {
  return launch_for_dtype(dtype, "scale_kernel", [&](auto tag) {
    using T = decltype(tag);
    scale_kernel<T><<<grid_for(n), kThreads, 0, stream>>>(static_cast<T*>(data), n, factor);
  });
}

// One wave of the kernel's resident blocks (grid_for's cap would make two uneven waves of these long loops); the
// occupancy is asked once per kernel, not on every timed call.
template <class Kernel>
int resident_grid(Kernel kernel, int64_t n) {
  static const int per_sm = [&] {
    int blocks = 0;
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kThreads, 0) == cudaSuccess && blocks > 0
               ? blocks
               : kBlocksPerSm;
  }();
  return grid_for(n, per_sm);
}

Result l2_read(const void* buf, size_t bytes, int passes, void* sink, cudaStream_t stream) {
  const int64_t n = int64_t(bytes / sizeof(uint4));
  l2_read_kernel<<<resident_grid(l2_read_kernel, n), kThreads, 0, stream>>>(
      static_cast<const uint4*>(buf), n, passes, static_cast<uint32_t*>(sink));
  return cuda_result(cudaGetLastError(), "l2_read_kernel");
}

Result l2_reduce(void* buf, size_t bytes, int passes, cudaStream_t stream) {
  const int64_t n = int64_t(bytes / sizeof(float4));
  l2_reduce_kernel<<<resident_grid(l2_reduce_kernel, n), kThreads, 0, stream>>>(static_cast<float4*>(buf), n, passes);
  return cuda_result(cudaGetLastError(), "l2_reduce_kernel");
}

cudaDataType_t cuda_data_type(DType dtype) {
  switch (dtype) {
    case DType::kBFloat16: return CUDA_R_16BF;
    case DType::kFloat16: return CUDA_R_16F;
    case DType::kFloat32: return CUDA_R_32F;
  }
  return CUDA_R_32F;
}

}  // namespace qkbench
