// What a call on Device::kCUDA says where it cannot run: no CUDA device (no GPU or no driver), or a library
// built without CUDA. Skipped where a CUDA device is present.
#include <gtest/gtest.h>

#include <string>

#include "test_util.h"
#if QKSOFTMAX_TEST_CUDA
#include "cuda_util.h"
#endif

namespace qksoftmax::test {
namespace {

#if QKSOFTMAX_TEST_CUDA
constexpr Code kUnavailableCode = Code::kCudaError;
constexpr const char* kUnavailableMessage = "q: no CUDA device is available";
#else
constexpr Code kUnavailableCode = Code::kUnsupported;
constexpr const char* kUnavailableMessage = "q: qksoftmax was built without CUDA";
#endif

TEST(Device, CudaUnavailableIsSaidPlainly) {
#if QKSOFTMAX_TEST_CUDA
  if (gpu_available()) GTEST_SKIP() << "a CUDA device is present: the GPU tests cover Device::kCUDA";
#endif
  const Case c{.B = 1, .Hq = 2, .Hk = 1, .Sq = 8, .Sk = 8, .D = 16};
  const Inputs in = make_inputs(c, test_seed());
  Outputs out(c, c.dtype, c.layout);
  const auto on_cuda = [](const HostTensor& t) { return t.desc(nullptr, Device::kCUDA); };
  const ForwardArgs fwd{on_cuda(in.q), on_cuda(in.k), on_cuda(out.p), on_cuda(out.lse)};
  const BackwardArgs bwd{on_cuda(in.q), on_cuda(in.k), on_cuda(in.dp), {}, {}, on_cuda(out.dq), on_cuda(out.dk)};
  const Outputs before = out;

  for (const Status& s : {forward(fwd, c.options(), nullptr, 0, nullptr),
                          backward(bwd, c.options(), nullptr, 0, nullptr)}) {
    EXPECT_EQ(int(s.code()), int(kUnavailableCode)) << s.message();
    EXPECT_EQ(s.message().rfind(kUnavailableMessage, 0), 0u) << s.message();
    EXPECT_EQ(s.message().find("insufficient"), std::string::npos) << s.message();
  }
  for (const auto& [now, was] : {std::pair{&out.p, &before.p}, {&out.lse, &before.lse}, {&out.dq, &before.dq},
                                 {&out.dk, &before.dk}}) {
    EXPECT_TRUE(bitwise_equal(*now, *was)) << "a refused call wrote memory";
  }
}

}  // namespace
}  // namespace qksoftmax::test
