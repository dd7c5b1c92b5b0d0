#include "ceilings.h"

#include "cuda_check.h"
#include "gpu.h"
#include "timing.h"

namespace qkbench {
namespace {

constexpr size_t kCopyBytes = size_t(2) << 30;  // 2 GiB each way: far past any L2
constexpr int kGemmSize = 8192;
constexpr int kWarmup = 5;
constexpr int kRuns = 20;
constexpr uint64_t kSeedA = 0xA11CE;
constexpr uint64_t kSeedB = 0xB0B;
constexpr double kGiga = 1e9;
constexpr double kTera = 1e12;
constexpr double kMicro = 1e-6;

Result copy_GBps(cudaStream_t stream, double* gbps) {
  DeviceBuffer src, dst;
  QKB_TRY(src.allocate(kCopyBytes));
  QKB_TRY(dst.allocate(kCopyBytes));
  QKB_CUDA(cudaMemsetAsync(src.get(), 1, kCopyBytes, stream));
  double us = 0;
  QKB_TRY(median_call_us(stream, {kWarmup, kRuns, 1}, [&](int) {
    return cuda_result(cudaMemcpyAsync(dst.get(), src.get(), kCopyBytes, cudaMemcpyDeviceToDevice, stream),
                       "cudaMemcpyAsync");
  }, &us));
  *gbps = 2 * double(kCopyBytes) / (us * kMicro) / kGiga;
  return {};
}

// Writes alone (cudaMemsetAsync), the traffic the forward is made of: reported beside the copy ceiling, which
// SOL uses.
Result write_GBps(cudaStream_t stream, double* gbps) {
  DeviceBuffer dst;
  QKB_TRY(dst.allocate(kCopyBytes));
  double us = 0;
  QKB_TRY(median_call_us(stream, {kWarmup, kRuns, 1}, [&](int) {
    return cuda_result(cudaMemsetAsync(dst.get(), 0, kCopyBytes, stream), "cudaMemsetAsync");
  }, &us));
  *gbps = double(kCopyBytes) / (us * kMicro) / kGiga;
  return {};
}

// L2: a buffer of a quarter of L2 (the H200's two partitions may each hold a copy) read, or reduce-added into,
// kL2Passes times per call, after the warm-up calls have brought it in.
constexpr int kL2Passes = 16;
constexpr int64_t kL2Fraction = 4;
Result l2_GBps(cudaStream_t stream, int64_t l2_bytes, double* read_gbps, double* reduce_gbps) {
  const size_t bytes = size_t(l2_bytes / kL2Fraction) / sizeof(float4) * sizeof(float4);
  DeviceBuffer buf, sink;
  QKB_TRY(buf.allocate(bytes));
  QKB_TRY(sink.allocate(sizeof(uint32_t)));
  QKB_CUDA(cudaMemsetAsync(buf.get(), 0, bytes, stream));
  double us = 0;
  QKB_TRY(median_call_us(stream, {kWarmup, kRuns, 1}, [&](int) {
    return l2_read(buf.get(), bytes, kL2Passes, sink.get(), stream);
  }, &us));
  *read_gbps = double(bytes) * kL2Passes / (us * kMicro) / kGiga;
  QKB_TRY(median_call_us(stream, {kWarmup, kRuns, 1}, [&](int) {
    return l2_reduce(buf.get(), bytes, kL2Passes, stream);
  }, &us));
  *reduce_gbps = double(bytes) * kL2Passes / (us * kMicro) / kGiga;
  return {};
}

// C = A B, all n×n of dtype, on data a and b already hold.
Result gemm_TFLOPs(cudaStream_t stream, cublasHandle_t cublas, DType dtype, cublasComputeType_t compute,
                   const DeviceBuffer& a, const DeviceBuffer& b, const DeviceBuffer& c, double* tflops) {
  const int64_t elements = int64_t(kGemmSize) * kGemmSize;
  QKB_TRY(fill_normal(a.get(), dtype, elements, kSeedA, stream));
  QKB_TRY(fill_normal(b.get(), dtype, elements, kSeedB, stream));
  const cudaDataType_t type = cuda_data_type(dtype);
  const float alpha = 1, beta = 0;
  double us = 0;
  QKB_TRY(median_call_us(stream, {kWarmup, kRuns, 1}, [&](int) {
    return cublas_result(cublasGemmEx(cublas, CUBLAS_OP_N, CUBLAS_OP_N, kGemmSize, kGemmSize, kGemmSize, &alpha,
                                      a.get(), type, kGemmSize, b.get(), type, kGemmSize, &beta, c.get(), type,
                                      kGemmSize, compute, CUBLAS_GEMM_DEFAULT),
                         "cublasGemmEx");
  }, &us));
  const double flops = 2.0 * kGemmSize * double(kGemmSize) * kGemmSize;
  *tflops = flops / (us * kMicro) / kTera;
  return {};
}

}  // namespace

Result measure_ceilings(cudaStream_t stream, cublasHandle_t cublas, Ceilings* ceilings) {
  QKB_TRY(copy_GBps(stream, &ceilings->copy_GBps));
  QKB_TRY(write_GBps(stream, &ceilings->write_GBps));
  DeviceInfo info;
  QKB_TRY(device_info(&info));
  QKB_TRY(l2_GBps(stream, info.l2_bytes, &ceilings->l2_read_GBps, &ceilings->l2_reduce_GBps));
  const size_t matrix_bytes = size_t(kGemmSize) * kGemmSize * sizeof(float);
  DeviceBuffer a, b, c;
  QKB_TRY(a.allocate(matrix_bytes));
  QKB_TRY(b.allocate(matrix_bytes));
  QKB_TRY(c.allocate(matrix_bytes));
  QKB_TRY(gemm_TFLOPs(stream, cublas, DType::kBFloat16, CUBLAS_COMPUTE_32F, a, b, c, &ceilings->bf16_TFLOPs));
  QKB_TRY(gemm_TFLOPs(stream, cublas, DType::kFloat16, CUBLAS_COMPUTE_32F, a, b, c, &ceilings->fp16_TFLOPs));
  QKB_TRY(gemm_TFLOPs(stream, cublas, DType::kFloat32, CUBLAS_COMPUTE_32F_FAST_TF32, a, b, c,
                      &ceilings->tf32_TFLOPs));
  QKB_TRY(gemm_TFLOPs(stream, cublas, DType::kFloat32, CUBLAS_COMPUTE_32F, a, b, c, &ceilings->fp32_TFLOPs));
  return {};
}

}  // namespace qkbench
