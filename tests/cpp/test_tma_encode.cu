// A TMA descriptor that fails to encode is a Status for the launch to return, never a print: CuTe's make_tma_copy
// encodes through encode_tma_tiled (cuda/tma_encode.h). Without a GPU the driver's encoder cannot be found (that
// is the failure); with one, a base address off TMA's 16-byte grid is refused by the driver. The tile is device
// memory where there is a GPU, as every descriptor the library encodes.
// (CUDA C++17: the tests' C++20 helpers are not included.)
#include <cuda_runtime.h>
#include <cute/tensor.hpp>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "cuda/device.h"
#include "cuda/tma_encode.h"

namespace qksoftmax::cuda {
namespace {

using namespace cute;
using Element = cutlass::bfloat16_t;
constexpr int kRows = 64, kCols = 64;
using SmemLayout = Layout<Shape<Int<kRows>, Int<kCols>>, Stride<Int<kCols>, _1>>;

alignas(128) Element host_buffer[kRows * kCols + kCols];

bool gpu_present() {
  int count = 0;
  const bool present = cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  cudaGetLastError();
  return present;
}

// The tile's memory for one test: on the device where there is one (freed with the test, so that memcheck's
// leak check over the suite finds nothing), else the host buffer.
class TileMemory {
 public:
  TileMemory() {
    if (gpu_present() && cudaMalloc(&device_, sizeof(host_buffer)) != cudaSuccess) {
      cudaGetLastError();
      device_ = nullptr;
    }
  }
  ~TileMemory() {
    if (device_ != nullptr) cudaFree(device_);
  }
  TileMemory(const TileMemory&) = delete;
  TileMemory& operator=(const TileMemory&) = delete;
  const Element* get() const { return device_ ? static_cast<const Element*>(device_) : host_buffer; }

 private:
  void* device_ = nullptr;
};

// Encodes a TMA load of a row-major kRows × kCols tile at `base`; returns what it printed to stderr.
std::string encode_at(const Element* base) {
  const auto gmem = make_tensor(make_gmem_ptr(base), make_shape(kRows, kCols), make_stride(kCols, _1{}));
  testing::internal::CaptureStderr();
  [[maybe_unused]] const auto copy = make_tma_copy(SM90_TMA_LOAD{}, gmem, SmemLayout{});
  return testing::internal::GetCapturedStderr();
}

TEST(TmaEncode, AFailureIsReturnedAndNothingIsPrinted) {
#ifndef NDEBUG
  GTEST_SKIP() << "CuTe asserts on the descriptor's alignment itself in debug builds";
#endif
  const bool gpu = gpu_present();
  ASSERT_TRUE(take_tma_failure("earlier").ok());
  const TileMemory tile;
  EXPECT_EQ(encode_at(gpu ? tile.get() + 1 : tile.get()), "");
  const Status s = take_tma_failure("test kernel");
  EXPECT_EQ(int(s.code()), int(Code::kCudaError));
  EXPECT_EQ(s.message().rfind("test kernel: a TMA descriptor failed to encode (", 0), 0u) << s.message();
  EXPECT_NE(s.message().find(gpu ? "cuTensorMapEncodeTiled returned CUDA_ERROR_INVALID_VALUE" : "could not be found"),
            std::string::npos)
      << s.message();
  EXPECT_TRUE(take_tma_failure("again").ok()) << "a failure is reported once";
}

TEST(TmaEncode, ADescriptorThatEncodesLeavesNoFailure) {
  if (!gpu_present()) GTEST_SKIP() << "no CUDA GPU: without one every descriptor fails (the test above)";
  const TileMemory tile;
  EXPECT_EQ(encode_at(tile.get()), "");
  const Status s = take_tma_failure("test kernel");
  EXPECT_TRUE(s.ok()) << s.message();
}

}  // namespace
}  // namespace qksoftmax::cuda
