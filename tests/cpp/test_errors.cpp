// Every error path of validation and of the API: the code, a message that starts with the argument's name,
// and not one byte of any buffer written.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "test_util.h"
#if QKSOFTMAX_TEST_CUDA
#include "cuda_util.h"
#endif

namespace qksoftmax::test {
namespace {

constexpr int64_t kPastInt32 = int64_t(1) << 31;
constexpr int64_t kHugeStride = int64_t(1) << 62;
constexpr size_t kSomeWorkspaceBytes = 1024;
constexpr DType kBadDType = DType(7);
constexpr Device kBadDevice = Device(7);

// A valid forward and backward call (bf16, B = 2, Hq = 4, Hk = 2, Sq = 8, Sk = 9, D = 16) on host tensors,
// recompute mode with lse, that each test breaks in one way.
struct ValidCall {
  ValidCall() {
    std::mt19937_64 rng(test_seed());
    for (HostTensor* t : {&q, &k, &dp, &p_in, &lse_in}) fill_normal(*t, rng);
    fwd = {q.desc(), k.desc(), p_out.desc(), lse_out.desc()};
    bwd.q = q.desc();
    bwd.k = k.desc();
    bwd.dp = dp.desc();
    bwd.lse = lse_in.desc();
    bwd.dq = dq.desc();
    bwd.dk = dk.desc();
  }

  void use_saved_p() {
    options.mode = BackwardMode::kSavedP;
    bwd.p = p_in.desc();
    bwd.lse = {};
  }

  // Every buffer's bytes, to prove that a failed call wrote nothing.
  std::vector<std::vector<std::byte>> snapshot() const {
    std::vector<std::vector<std::byte>> bytes;
    for (const HostTensor* t : {&q, &k, &dp, &p_in, &lse_in, &p_out, &lse_out, &dq, &dk}) {
      bytes.push_back(t->storage());
    }
    return bytes;
  }

  const Case dims{.B = 2, .Hq = 4, .Hk = 2, .Sq = 8, .Sk = 9, .D = 16};
  HostTensor q{dims.dtype, dims.q_shape()}, k{dims.dtype, dims.k_shape()}, dp{dims.dtype, dims.probs_shape()};
  HostTensor p_in{dims.dtype, dims.probs_shape()}, lse_in{DType::kFloat32, dims.lse_shape()};
  HostTensor p_out{dims.dtype, dims.probs_shape()}, lse_out{DType::kFloat32, dims.lse_shape()};
  HostTensor dq{dims.dtype, dims.q_shape()}, dk{dims.dtype, dims.k_shape()};
  ForwardArgs fwd;
  BackwardArgs bwd;
  Options options = dims.options();
};

void expect_status(const Status& s, Code code, const std::string& arg) {
  EXPECT_EQ(int(s.code()), int(code)) << s.message();
  EXPECT_EQ(s.message().rfind(arg + ": ", 0), 0u) << "the message should start with '" << arg
                                                    << ": ', got: " << s.message();
}

enum class Calls : uint8_t { kForward, kBackward, kBoth };

// The size query and the call fail with kInvalidArgument naming arg, and write nothing.
void expect_invalid(const ValidCall& call, Calls calls, const std::string& arg) {
  const auto before = call.snapshot();
  size_t bytes = 0;
  if (calls != Calls::kBackward) {
    expect_status(forward_workspace_size(call.fwd, call.options, &bytes), Code::kInvalidArgument, arg);
    expect_status(forward(call.fwd, call.options, nullptr, 0, nullptr), Code::kInvalidArgument, arg);
  }
  if (calls != Calls::kForward) {
    expect_status(backward_workspace_size(call.bwd, call.options, &bytes), Code::kInvalidArgument, arg);
    expect_status(backward(call.bwd, call.options, nullptr, 0, nullptr), Code::kInvalidArgument, arg);
  }
  EXPECT_EQ(call.snapshot(), before) << "a failed call wrote memory";
}

// One way to break the valid call, and the argument the error must name.
struct Breakage {
  const char* name;
  Calls calls;
  const char* arg;
  void (*apply)(ValidCall&);
};

void PrintTo(const Breakage& b, std::ostream* os) { *os << b.name; }

const Breakage kBreakages[] = {
    // Required tensors.
    {"ForwardNeedsQ", Calls::kForward, "q", [](ValidCall& c) { c.fwd.q.data = nullptr; }},
    {"ForwardNeedsK", Calls::kForward, "k", [](ValidCall& c) { c.fwd.k.data = nullptr; }},
    {"ForwardNeedsP", Calls::kForward, "p", [](ValidCall& c) { c.fwd.p.data = nullptr; }},
    {"BackwardNeedsQ", Calls::kBackward, "q", [](ValidCall& c) { c.bwd.q.data = nullptr; }},
    {"BackwardNeedsK", Calls::kBackward, "k", [](ValidCall& c) { c.bwd.k.data = nullptr; }},
    {"BackwardNeedsDp", Calls::kBackward, "dp", [](ValidCall& c) { c.bwd.dp.data = nullptr; }},
    {"BackwardNeedsDq", Calls::kBackward, "dq", [](ValidCall& c) { c.bwd.dq.data = nullptr; }},
    {"BackwardNeedsDk", Calls::kBackward, "dk", [](ValidCall& c) { c.bwd.dk.data = nullptr; }},
    {"SavedPModeNeedsP", Calls::kBackward, "p",
     [](ValidCall& c) {
       c.use_saved_p();
       c.bwd.p = {};
     }},
    {"RecomputeModeRejectsP", Calls::kBackward, "p", [](ValidCall& c) { c.bwd.p = c.p_in.desc(); }},
    // Each tensor alone.
    {"QRank", Calls::kForward, "q", [](ValidCall& c) { c.fwd.q.rank = 3; }},
    {"LseRank", Calls::kForward, "lse", [](ValidCall& c) { c.fwd.lse.rank = kMaxRank; }},
    {"RankBeyondMax", Calls::kBackward, "dp", [](ValidCall& c) { c.bwd.dp.rank = kMaxRank + 1; }},
    {"ZeroDimension", Calls::kForward, "k", [](ValidCall& c) { c.fwd.k.shape[2] = 0; }},
    {"NegativeStride", Calls::kBackward, "dp", [](ValidCall& c) { c.bwd.dp.stride[2] = -1; }},
    {"DTypeValue", Calls::kForward, "q", [](ValidCall& c) { c.fwd.q.dtype = kBadDType; }},
    {"DeviceValue", Calls::kForward, "k", [](ValidCall& c) { c.fwd.k.device = kBadDevice; }},
    {"MisalignedData", Calls::kForward, "q",
     [](ValidCall& c) { c.fwd.q.data = static_cast<std::byte*>(c.fwd.q.data) + 1; }},
    // Shapes.
    {"KBatch", Calls::kForward, "k", [](ValidCall& c) { c.fwd.k.shape[0] = c.dims.B + 1; }},
    {"KHeadDim", Calls::kForward, "k", [](ValidCall& c) { c.fwd.k.shape[3] = c.dims.D / 2; }},
    {"KHeadsDivideQHeads", Calls::kForward, "k", [](ValidCall& c) { c.fwd.k.shape[1] = 3; }},
    {"ForwardPShape", Calls::kForward, "p", [](ValidCall& c) { c.fwd.p.shape[3] = c.dims.Sk + 1; }},
    {"ForwardLseShape", Calls::kForward, "lse", [](ValidCall& c) { c.fwd.lse.shape[2] = c.dims.Sq - 1; }},
    {"DpShape", Calls::kBackward, "dp", [](ValidCall& c) { c.bwd.dp.shape[1] = c.dims.Hk; }},
    {"SavedPShape", Calls::kBackward, "p",
     [](ValidCall& c) {
       c.use_saved_p();
       c.bwd.p.shape[2] = c.dims.Sq + 1;
     }},
    {"BackwardLseShape", Calls::kBackward, "lse", [](ValidCall& c) { c.bwd.lse.shape[0] = c.dims.B + 1; }},
    {"DqShape", Calls::kBackward, "dq", [](ValidCall& c) { c.bwd.dq.shape[3] = c.dims.D + 1; }},
    {"DkShape", Calls::kBackward, "dk", [](ValidCall& c) { c.bwd.dk.shape[2] = c.dims.Sk - 1; }},
    {"SqBeyondInt32", Calls::kForward, "q", [](ValidCall& c) { c.fwd.q.shape[2] = kPastInt32; }},
    {"SkBeyondInt32", Calls::kForward, "k", [](ValidCall& c) { c.fwd.k.shape[2] = kPastInt32; }},
    {"HeadDimBeyondInt32", Calls::kForward, "q",
     [](ValidCall& c) {
       c.fwd.q.shape[3] = kPastInt32;
       c.fwd.k.shape[3] = kPastInt32;
     }},
    // Dtypes and devices.
    {"InputDTypeMismatch", Calls::kForward, "k", [](ValidCall& c) { c.fwd.k.dtype = DType::kFloat16; }},
    {"OutputDTypeMismatch", Calls::kBackward, "dq", [](ValidCall& c) { c.bwd.dq.dtype = DType::kFloat32; }},
    {"LseMustBeFloat32", Calls::kBackward, "lse", [](ValidCall& c) { c.bwd.lse.dtype = DType::kBFloat16; }},
    {"DeviceMismatch", Calls::kBackward, "dp", [](ValidCall& c) { c.bwd.dp.device = Device::kCUDA; }},
    // On the CUDA device rows must be contiguous; validation says so before any pointer is looked at.
    {"CudaLastDimStride", Calls::kForward, "q",
     [](ValidCall& c) {
       for (TensorDesc* t : {&c.fwd.q, &c.fwd.k, &c.fwd.p, &c.fwd.lse}) t->device = Device::kCUDA;
       c.fwd.q.stride[3] = 2;
     }},
    // Memory of outputs.
    {"OutputZeroStride", Calls::kForward, "p", [](ValidCall& c) { c.fwd.p.stride[3] = 0; }},
    {"OutputStridesCollide", Calls::kBackward, "dq",
     [](ValidCall& c) {
       c.bwd.dq.stride[2] = 1;
       c.bwd.dq.stride[3] = 1;
     }},
    {"OutputOverlapsInput", Calls::kForward, "p", [](ValidCall& c) { c.fwd.p.data = c.fwd.q.data; }},
    {"OutputsOverlapEachOther", Calls::kBackward, "dq", [](ValidCall& c) { c.bwd.dk.data = c.bwd.dq.data; }},
    {"LseOutputInsideP", Calls::kForward, "p",
     [](ValidCall& c) { c.fwd.lse.data = static_cast<std::byte*>(c.fwd.p.data) + 2 * sizeof(float); }},
    {"StridesAddressTooFar", Calls::kBackward, "dp", [](ValidCall& c) { c.bwd.dp.stride[0] = kHugeStride; }},
    // The last element exactly at 2^63 - 1: one more element is past int64 (UBSan's check of validation).
    {"StridesReachInt64Max", Calls::kBackward, "dp",
     [](ValidCall& c) {
       c.bwd.dp.stride[0] = std::numeric_limits<int64_t>::max();
       c.bwd.dp.stride[1] = c.bwd.dp.stride[2] = c.bwd.dp.stride[3] = 0;
     }},
    // Options.
    {"ScaleInfinite", Calls::kBoth, "options.scale",
     [](ValidCall& c) { c.options.scale = std::numeric_limits<double>::infinity(); }},
    {"ScaleNaN", Calls::kBoth, "options.scale",
     [](ValidCall& c) { c.options.scale = std::numeric_limits<double>::quiet_NaN(); }},
    {"ScaleBeyondFloat32", Calls::kBoth, "options.scale", [](ValidCall& c) { c.options.scale = 1e300; }},
    {"MaskValue", Calls::kBoth, "options.mask", [](ValidCall& c) { c.options.mask = Mask(9); }},
    {"ModeValue", Calls::kBackward, "options.mode", [](ValidCall& c) { c.options.mode = BackwardMode(9); }},
};

class Broken : public ::testing::TestWithParam<Breakage> {};

TEST_P(Broken, FailsNamingTheArgument) {
  ValidCall call;
  GetParam().apply(call);
  expect_invalid(call, GetParam().calls, GetParam().arg);
}

INSTANTIATE_TEST_SUITE_P(Errors, Broken, ::testing::ValuesIn(kBreakages),
                         [](const auto& info) { return std::string(info.param.name); });

class Errors : public ::testing::Test {
 protected:
  ValidCall call_;
};

// The unbroken calls succeed: every failure above comes from its one change.
TEST_F(Errors, ValidCallsSucceed) {
  size_t bytes = 1;
  ASSERT_TRUE(forward_workspace_size(call_.fwd, call_.options, &bytes).ok());
  EXPECT_EQ(bytes, 0u) << "the CPU backend needs no workspace";
  EXPECT_TRUE(forward(call_.fwd, call_.options, nullptr, 0, nullptr).ok());
  call_.fwd.lse = {};
  EXPECT_TRUE(forward(call_.fwd, call_.options, nullptr, 0, nullptr).ok());
  EXPECT_TRUE(backward(call_.bwd, call_.options, nullptr, 0, nullptr).ok());
  call_.bwd.lse = {};
  EXPECT_TRUE(backward(call_.bwd, call_.options, nullptr, 0, nullptr).ok());
  call_.use_saved_p();
  EXPECT_TRUE(backward(call_.bwd, call_.options, nullptr, 0, nullptr).ok());
}

// Inputs may broadcast (a zero stride) and size-1 dimensions may have any stride.
TEST_F(Errors, BroadcastInputsAndSize1StridesAreValid) {
  call_.bwd.dp.stride[0] = 0;
  call_.bwd.q.stride[0] = 0;
  EXPECT_TRUE(backward(call_.bwd, call_.options, nullptr, 0, nullptr).ok());
  const Case& c = call_.dims;
  HostTensor one_row(c.dtype, {c.B, c.Hq, 1, c.D});
  TensorDesc q = one_row.desc();
  q.stride[2] = kHugeStride;
  HostTensor p(c.dtype, {c.B, c.Hq, 1, c.Sk});  // named: the call writes it
  const ForwardArgs args{q, call_.k.desc(), p.desc(), {}};
  EXPECT_TRUE(forward(args, call_.options, nullptr, 0, nullptr).ok());
}

TEST_F(Errors, MessageNamesExpectedAndActualShape) {
  call_.bwd.dk.shape[2] = call_.dims.Sk - 1;
  EXPECT_EQ(backward(call_.bwd, call_.options, nullptr, 0, nullptr).message(),
            "dk: expected shape (2, 2, 9, 16) like k, got (2, 2, 8, 16)");
}

TEST_F(Errors, CudaStrideMessageSaysStride1) {
  for (TensorDesc* t : {&call_.fwd.q, &call_.fwd.k, &call_.fwd.p, &call_.fwd.lse}) t->device = Device::kCUDA;
  call_.fwd.q.stride[3] = 2;
  const std::string message = forward(call_.fwd, call_.options, nullptr, 0, nullptr).message();
  EXPECT_NE(message.find("stride 1"), std::string::npos) << message;
}

TEST_F(Errors, SizeQueryNeedsBytes) {
  expect_status(forward_workspace_size(call_.fwd, call_.options, nullptr), Code::kInvalidArgument, "bytes");
  expect_status(backward_workspace_size(call_.bwd, call_.options, nullptr), Code::kInvalidArgument, "bytes");
}

TEST_F(Errors, WorkspaceMisaligned) {
  std::vector<std::byte> buffer(kSomeWorkspaceBytes + kWorkspaceAlignment);
  const size_t past = reinterpret_cast<uintptr_t>(buffer.data()) % kWorkspaceAlignment;
  std::byte* aligned = buffer.data() + (kWorkspaceAlignment - past) % kWorkspaceAlignment;
  const auto before = call_.snapshot();
  const Code code = Code::kWorkspaceTooSmall;
  expect_status(forward(call_.fwd, call_.options, aligned + 1, kSomeWorkspaceBytes, nullptr), code, "workspace");
  expect_status(backward(call_.bwd, call_.options, aligned + 1, kSomeWorkspaceBytes, nullptr), code, "workspace");
  EXPECT_EQ(call_.snapshot(), before);
}

#if QKSOFTMAX_TEST_CUDA
TEST_F(Errors, GpuWorkspaceTooSmall) {
  QKSOFTMAX_NEED_GPU();
  const Case c{.B = 2, .Hq = 4, .Hk = 2, .Sq = 1000, .Sk = 1000, .D = 128};
  const Inputs in = make_inputs(c, test_seed());
  Outputs out(c, c.dtype, c.layout);
  const DeviceTensor q(in.q), k(in.k), dp(in.dp);
  DeviceTensor dq(out.dq), dk(out.dk);
  const BackwardArgs args = make_backward_args(q, k, dp, {}, {}, dq.desc(), dk.desc());
  size_t bytes = 0;
  ASSERT_TRUE(backward_workspace_size(args, c.options(), &bytes).ok());
  ASSERT_GT(bytes, 0u) << "a recompute backward without lse keeps LSE and D in the workspace";
  DeviceBuffer workspace(bytes);
  expect_status(backward(args, c.options(), workspace.get(), bytes - 1, nullptr), Code::kWorkspaceTooSmall,
                "workspace");
  expect_status(backward(args, c.options(), nullptr, bytes, nullptr), Code::kWorkspaceTooSmall, "workspace");
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (auto [dev, host] : {std::pair{&dq, &out.dq}, {&dk, &out.dk}}) {
    ASSERT_TRUE(dev->download(*host).ok());
    const std::vector<std::byte>& stored = host->storage();
    EXPECT_TRUE(std::all_of(stored.begin(), stored.end(), [](std::byte b) { return b == kPoisonByte; }))
        << "a failed call wrote memory";
  }
}

// Descriptors that say CUDA but point at host memory.
TEST_F(Errors, GpuHostPointers) {
  QKSOFTMAX_NEED_GPU();
  for (TensorDesc* t : {&call_.fwd.q, &call_.fwd.k, &call_.fwd.p, &call_.fwd.lse}) t->device = Device::kCUDA;
  const auto before = call_.snapshot();
  expect_status(forward(call_.fwd, call_.options, nullptr, 0, nullptr), Code::kInvalidArgument, "q");
  EXPECT_EQ(call_.snapshot(), before);
}
#endif  // QKSOFTMAX_TEST_CUDA

// fp64 is valid but runs on the CPU backend only: validation says so before any pointer is looked at, so
// descriptors that say CUDA over host memory reach that check without a GPU.
TEST_F(Errors, Float64OnCudaIsUnsupported) {
  const Case& c = call_.dims;
  HostTensor q(DType::kFloat64, c.q_shape()), k(DType::kFloat64, c.k_shape());
  HostTensor p(DType::kFloat64, c.probs_shape()), dq(DType::kFloat64, c.q_shape()), dk(DType::kFloat64, c.k_shape());
  const auto on_cuda = [](const HostTensor& t) { return t.desc(nullptr, Device::kCUDA); };
  const ForwardArgs fwd{on_cuda(q), on_cuda(k), on_cuda(p), {}};
  const BackwardArgs bwd{on_cuda(q), on_cuda(k), on_cuda(p), {}, {}, on_cuda(dq), on_cuda(dk)};
  size_t bytes = 0;
  expect_status(forward_workspace_size(fwd, call_.options, &bytes), Code::kUnsupported, "q");
  expect_status(backward_workspace_size(bwd, call_.options, &bytes), Code::kUnsupported, "q");
  EXPECT_EQ(forward(fwd, call_.options, nullptr, 0, nullptr).message(), "q: float64 runs on the CPU backend only");
  expect_status(backward(bwd, call_.options, nullptr, 0, nullptr), Code::kUnsupported, "q");
}

TEST(Api, VersionIsMajorMinorPatch) {
  int major = -1, minor = -1, patch = -1;
  ASSERT_EQ(std::sscanf(version(), "%d.%d.%d", &major, &minor, &patch), 3) << version();
  EXPECT_GE(major, 0);
  EXPECT_GE(minor, 0);
  EXPECT_GE(patch, 0);
}

}  // namespace
}  // namespace qksoftmax::test
