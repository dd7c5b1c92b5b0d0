// Plans: one validation per call, runs without validating again, the same results as forward and backward; the
// device a CUDA call runs on (declared or looked up, never mixed), whatever device is current, in any thread.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "counters.h"
#include "test_util.h"
#if QKSOFTMAX_TEST_CUDA
#include "cuda_util.h"
#endif

namespace qksoftmax::test {
namespace {

uint64_t validations() { return detail::call_counters().validations.load(); }
uint64_t pointer_queries() { return detail::call_counters().pointer_queries.load(); }

const Case kCase{.B = 2, .Hq = 4, .Hk = 2, .Sq = 9, .Sk = 7, .D = 16, .dtype = DType::kFloat32};

TEST(Plan, ValidatesOnceAndRunsLikeForwardAndBackward) {
  const Inputs in = make_inputs(kCase, test_seed());
  Outputs expected(kCase, kCase.dtype, kCase.layout), planned(kCase, kCase.dtype, kCase.layout);
  ASSERT_TRUE(cpu_run(kCase, in, expected).ok());

  const uint64_t before = validations();
  Plan fwd, bwd;
  ASSERT_TRUE(plan_forward({in.q.desc(), in.k.desc(), planned.p.desc(), planned.lse.desc()}, kCase.options(), &fwd)
                  .ok());
  ASSERT_TRUE(plan_backward(in.backward_args(planned.dq.desc(), planned.dk.desc()), kCase.options(), &bwd).ok());
  EXPECT_EQ(validations() - before, 2u);
  for (int repeat = 0; repeat < 2; ++repeat) {
    ASSERT_TRUE(fwd.run(nullptr, 0, nullptr).ok());
    ASSERT_TRUE(bwd.run(nullptr, 0, nullptr).ok());
  }
  EXPECT_EQ(validations() - before, 2u) << "a plan's run validated again";
  expect_bitwise_equal(planned, expected);
  EXPECT_EQ(fwd.device(), Device::kCPU);
  EXPECT_EQ(fwd.device_index(), -1);
  EXPECT_EQ(fwd.workspace_bytes(), 0u);
}

TEST(Plan, ForwardAndBackwardValidateOnce) {
  const Inputs in = make_inputs(kCase, test_seed());
  Outputs out(kCase, kCase.dtype, kCase.layout);
  const uint64_t before = validations();
  ASSERT_TRUE(cpu_run(kCase, in, out).ok());
  EXPECT_EQ(validations() - before, 2u);
}

TEST(Plan, AnEmptyPlanIsRefused) {
  const Plan plan;
  EXPECT_FALSE(plan.valid());
  const Status s = plan.run(nullptr, 0, nullptr);
  EXPECT_EQ(int(s.code()), int(Code::kInvalidArgument));
  EXPECT_EQ(s.message().rfind("plan: ", 0), 0u) << s.message();
}

TEST(Plan, NeedsAPlanToFill) {
  const Inputs in = make_inputs(kCase, test_seed());
  Outputs out(kCase, kCase.dtype, kCase.layout);
  const Status s = plan_forward({in.q.desc(), in.k.desc(), out.p.desc(), {}}, kCase.options(), nullptr);
  EXPECT_EQ(int(s.code()), int(Code::kInvalidArgument));
  EXPECT_EQ(s.message().rfind("plan: ", 0), 0u) << s.message();
}

TEST(Plan, ARefusedCallLeavesThePlanAsItWas) {
  const Inputs in = make_inputs(kCase, test_seed());
  Outputs out(kCase, kCase.dtype, kCase.layout);
  Plan plan;
  ASSERT_TRUE(plan_forward({in.q.desc(), in.k.desc(), out.p.desc(), {}}, kCase.options(), &plan).ok());
  const Status s = plan_forward({in.q.desc(), in.k.desc(), out.dq.desc(), {}}, kCase.options(), &plan);
  EXPECT_EQ(int(s.code()), int(Code::kInvalidArgument));
  ASSERT_TRUE(plan.valid());
  EXPECT_TRUE(plan.run(nullptr, 0, nullptr).ok());
  expect_masked_zero(out.p, kCase.mask);
}

TEST(Plan, RunChecksTheWorkspace) {
  const Inputs in = make_inputs(kCase, test_seed());
  Outputs out(kCase, kCase.dtype, kCase.layout);
  Plan plan;
  ASSERT_TRUE(plan_forward({in.q.desc(), in.k.desc(), out.p.desc(), {}}, kCase.options(), &plan).ok());
  alignas(kWorkspaceAlignment) static std::byte workspace[2 * kWorkspaceAlignment];
  const Status s = plan.run(workspace + 1, kWorkspaceAlignment, nullptr);
  EXPECT_EQ(int(s.code()), int(Code::kWorkspaceTooSmall)) << s.message();
}

// Validation alone decides this (no device is asked), so host memory described as CUDA memory will do.
TEST(DeviceIndex, TensorsDeclaredOnTwoDevicesAreRefused) {
  const Inputs in = make_inputs(kCase, test_seed());
  Outputs out(kCase, kCase.dtype, kCase.layout);
  const auto on = [](const HostTensor& t, int device) {
    TensorDesc d = t.desc(nullptr, Device::kCUDA);
    d.device_index = device;
    return d;
  };
  const uint64_t queries = pointer_queries();
  Plan plan;
  Status s = plan_forward({on(in.q, 0), on(in.k, 1), on(out.p, 0), {}}, kCase.options(), &plan);
  EXPECT_EQ(int(s.code()), int(Code::kInvalidArgument));
  EXPECT_EQ(s.message(), "k: expected device cuda:0 like q, got cuda:1 (the tensors of a call must be on one device)");
  const BackwardArgs bwd{on(in.q, -1), on(in.k, 2), on(in.dp, 2), {}, {}, on(out.dq, 2), on(out.dk, 3)};
  s = backward(bwd, kCase.options(), nullptr, 0, nullptr);
  EXPECT_EQ(s.message(), "dk: expected device cuda:2 like k, got cuda:3 (the tensors of a call must be on one device)");
  EXPECT_FALSE(plan.valid());
  EXPECT_EQ(pointer_queries(), queries);
}

#if QKSOFTMAX_TEST_CUDA

// The size query for tensors declared on the GPU (no GPU needed: the query looks at no pointer).
size_t cuda_backward_workspace(const Case& c) {
  HostTensor q(c.dtype, c.q_shape()), k(c.dtype, c.k_shape()), dp(c.dtype, c.probs_shape());
  HostTensor p(c.dtype, c.probs_shape()), dq(c.dtype, c.q_shape()), dk(c.dtype, c.k_shape());
  const auto on_cuda = [](const HostTensor& t) { return t.desc(nullptr, Device::kCUDA); };
  const bool saved_p = c.variant == Variant::kSavedP;
  const BackwardArgs args{on_cuda(q), on_cuda(k), on_cuda(dp), saved_p ? on_cuda(p) : TensorDesc{}, {},
                          on_cuda(dq), on_cuda(dk)};
  size_t bytes = 0;
  EXPECT_TRUE(backward_workspace_size(args, c.options(), &bytes).ok());
  return bytes;
}

// What the size query counts, by alignment unit: the row vectors (LSE unless saved-P, and D); for the two-pass Hopper
// backward (16-bit, D = 128, more keys than the single pass takes, not deterministic) also the key-block pass's
// tile counter, one unit, and the fp32 dQ accumulator; none of those where the single pass or the generic
// kernels run.
TEST(WorkspaceSize, TwoPassBackwardCountsTheTileCounter) {
  const auto aligned = [](size_t bytes) {
    return (bytes + kWorkspaceAlignment - 1) / kWorkspaceAlignment * kWorkspaceAlignment;
  };
  const Case two_pass{.B = 1, .Hq = 2, .Hk = 2, .Sq = 264, .Sk = 264, .D = 128};
  const size_t vector = aligned(size_t(two_pass.B * two_pass.Hq * two_pass.Sq) * sizeof(float));
  const size_t accumulator = aligned(size_t(two_pass.B * two_pass.Hq * two_pass.Sq * two_pass.D) * sizeof(float));
  const size_t counter = kWorkspaceAlignment;
  EXPECT_EQ(cuda_backward_workspace(two_pass), 2 * vector + counter + accumulator);
  Case saved_p = two_pass;
  saved_p.variant = Variant::kSavedP;
  EXPECT_EQ(cuda_backward_workspace(saved_p), vector + counter + accumulator);
  Case deterministic = two_pass;  // the single pass, which sums in a fixed order
  deterministic.deterministic = true;
  EXPECT_EQ(cuda_backward_workspace(deterministic), 2 * vector);
  Case generic = two_pass;
  generic.D = 64;
  EXPECT_EQ(cuda_backward_workspace(generic), 2 * vector);
}

int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
  cudaGetLastError();
  return count;
}

int current_device() {
  int device = -1;
  EXPECT_EQ(cudaGetDevice(&device), cudaSuccess);
  return device;
}

// Sets `device` current for a scope, then the previous one again.
class OnDevice {
 public:
  explicit OnDevice(int device) {
    EXPECT_EQ(cudaGetDevice(&previous_), cudaSuccess);
    EXPECT_EQ(cudaSetDevice(device), cudaSuccess);
  }
  ~OnDevice() { EXPECT_EQ(cudaSetDevice(previous_), cudaSuccess); }
  OnDevice(const OnDevice&) = delete;
  OnDevice& operator=(const OnDevice&) = delete;

 private:
  int previous_ = 0;
};

// A bf16 forward + backward (recompute, D = 128: the Hopper kernels and their TMA descriptors) with its tensors on
// `device`, every tensor declaring `declared` as its device (-1: none declared, looked up), against the CPU backend.
class GpuRun {
 public:
  GpuRun(int device, int declared)
      : device_(device), declared_(declared), in_(make_inputs(kGpuCase, test_seed())),
        expected_(kGpuCase, kGpuCase.dtype, kGpuCase.layout), got_(kGpuCase, kGpuCase.dtype, kGpuCase.layout) {
    EXPECT_TRUE(cpu_run(kGpuCase, in_, expected_).ok());
    const OnDevice on(device);
    tensors_.reserve(kTensors);
    for (const HostTensor* t : {&in_.q, &in_.k, &in_.dp, &got_.p, &got_.lse, &got_.dq, &got_.dk}) {
      tensors_.emplace_back(*t);
    }
  }

  // Plans and runs both calls from the calling thread, on the null stream; says what failed.
  Status launch() {
    const auto desc = [&](size_t i) {
      TensorDesc d = tensors_[i].desc();
      d.device_index = declared_;
      return d;
    };
    Plan fwd, bwd;
    if (Status s = plan_forward({desc(kQ), desc(kK), desc(kP), desc(kLse)}, kGpuCase.options(), &fwd); !s.ok()) {
      return s;
    }
    const BackwardArgs args{desc(kQ), desc(kK), desc(kDp), {}, {}, desc(kDq), desc(kDk)};
    if (Status s = plan_backward(args, kGpuCase.options(), &bwd); !s.ok()) return s;
    EXPECT_EQ(fwd.device_index(), device_);
    EXPECT_EQ(bwd.device_index(), device_);
    if (Status s = fwd.run(nullptr, 0, nullptr); !s.ok()) return s;
    return bwd.run(workspace_.get(), workspace_.bytes(), nullptr);
  }

  void check() {
    const OnDevice on(device_);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    for (size_t i : {kP, kLse, kDq, kDk}) {
      ASSERT_TRUE(tensors_[i].download(*outputs()[i - kP]).ok());
    }
    expect_close("p", got_.p, expected_.p.values(), accuracy::bound(kGpuCase.dtype));
    expect_close("dq", got_.dq, expected_.dq.values(), accuracy::bound(kGpuCase.dtype));
    expect_close("dk", got_.dk, expected_.dk.values(), accuracy::bound(kGpuCase.dtype));
  }

 private:
  static constexpr Case kGpuCase{.B = 2, .Hq = 4, .Hk = 2, .Sq = 33, .Sk = 40, .D = 128};
  enum : size_t { kQ, kK, kDp, kP, kLse, kDq, kDk, kTensors };

  std::vector<HostTensor*> outputs() { return {&got_.p, &got_.lse, &got_.dq, &got_.dk}; }
  size_t backward_workspace() const {
    size_t bytes = 0;
    BackwardArgs args{in_.q.desc(), in_.k.desc(), in_.dp.desc(), {}, {}, got_.dq.desc(), got_.dk.desc()};
    for (TensorDesc* t : {&args.q, &args.k, &args.dp, &args.dq, &args.dk}) t->device = Device::kCUDA;
    EXPECT_TRUE(backward_workspace_size(args, kGpuCase.options(), &bytes).ok());
    return bytes;
  }

  int device_, declared_;
  Inputs in_;
  Outputs expected_, got_;
  std::vector<DeviceTensor> tensors_;
  DeviceBuffer workspace_{[&] {
    const OnDevice on(device_);
    return DeviceBuffer(backward_workspace());
  }()};
};

// The GPU tests of plans and devices.
class GpuPlan : public GpuTest {};

void expect_gpu_run_matches_cpu(int device, int declared) {
  GpuRun run(device, declared);
  int current = -1;
  ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
  const Status s = run.launch();
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(current_device(), current) << "a call left another device current";
  run.check();
}

TEST_F(GpuPlan, DeclaredDevicesAskTheDriverNothing) {
  const uint64_t before = pointer_queries();
  expect_gpu_run_matches_cpu(0, 0);
  EXPECT_EQ(pointer_queries(), before);
}

// A plan asks for the workspace of the kernel that runs it, where the size query, which cannot know the
// pointers, counts for the worst: none for the single-pass Hopper backward (TMA-ready 16-bit tensors, D = 128,
// 64 keys); the generic kernels' row vectors alone for the two-pass one that adds dQ straight into dQ (264
// keys), without the fp32 accumulator that the query counts; what the query says where the accumulator is
// used (1032 keys) or the kernels are generic (D = 64).
TEST_F(GpuPlan, AsksForItsKernelsWorkspace) {
  enum class Expect { kNone, kLess, kQuery };
  const std::pair<Case, Expect> cases[] = {
      {{.B = 1, .Hq = 2, .Hk = 2, .Sq = 64, .Sk = 64, .D = 128}, Expect::kNone},
      {{.B = 1, .Hq = 2, .Hk = 2, .Sq = 64, .Sk = 64, .D = 64}, Expect::kQuery},
      {{.B = 1, .Hq = 2, .Hk = 2, .Sq = 264, .Sk = 264, .D = 128}, Expect::kLess},
      {{.B = 1, .Hq = 2, .Hk = 2, .Sq = 136, .Sk = 1032, .D = 128}, Expect::kQuery},
  };
  for (const auto& [c, expect] : cases) {
    SCOPED_TRACE(case_name(c));
    const Inputs in = make_inputs(c, test_seed());
    Outputs expected(c, c.dtype, c.layout), got(c, c.dtype, c.layout);
    ASSERT_TRUE(cpu_run(c, in, expected).ok());
    const DeviceTensor q(in.q), k(in.k), dp(in.dp), dq(got.dq), dk(got.dk);
    const BackwardArgs args{q.desc(), k.desc(), dp.desc(), {}, {}, dq.desc(), dk.desc()};
    size_t query = 0;
    ASSERT_TRUE(backward_workspace_size(args, c.options(), &query).ok());
    Plan plan;
    ASSERT_TRUE(plan_backward(args, c.options(), &plan).ok());
    EXPECT_GT(query, 0u);
    switch (expect) {
      case Expect::kNone: EXPECT_EQ(plan.workspace_bytes(), 0u); break;
      case Expect::kLess:
        EXPECT_GT(plan.workspace_bytes(), 0u);
        EXPECT_LT(plan.workspace_bytes(), query);
        break;
      case Expect::kQuery: EXPECT_EQ(plan.workspace_bytes(), query); break;
    }
    const DeviceBuffer workspace(plan.workspace_bytes());
    const Status s = plan.run(workspace.get(), plan.workspace_bytes(), nullptr);
    ASSERT_TRUE(s.ok()) << s.message();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ASSERT_TRUE(dq.download(got.dq).ok());
    ASSERT_TRUE(dk.download(got.dk).ok());
    expect_close("dq", got.dq, expected.dq.values(), accuracy::bound(c.dtype));
    expect_close("dk", got.dk, expected.dk.values(), accuracy::bound(c.dtype));
  }
}

TEST_F(GpuPlan, UndeclaredPointersAreAskedOnceEach) {
  const Case c{.B = 1, .Hq = 2, .Hk = 2, .Sq = 8, .Sk = 8, .D = 64};
  const Inputs in = make_inputs(c, test_seed());
  Outputs out(c, c.dtype, c.layout);
  const DeviceTensor q(in.q), p(out.p), lse(out.lse);
  const uint64_t before = pointer_queries();
  Plan plan;
  // q serves as k too: three distinct pointers.
  ASSERT_TRUE(plan_forward({q.desc(), q.desc(), p.desc(), lse.desc()}, c.options(), &plan).ok());
  EXPECT_EQ(pointer_queries() - before, 3u);
  EXPECT_EQ(plan.device_index(), current_device());
}

TEST_F(GpuPlan, ADeclaredDeviceThatDoesNotExistIsRefused) {
  const Case c{.B = 1, .Hq = 1, .Hk = 1, .Sq = 8, .Sk = 8, .D = 64};
  const Inputs in = make_inputs(c, test_seed());
  Outputs out(c, c.dtype, c.layout);
  const DeviceTensor q(in.q), p(out.p);
  const auto on = [](const DeviceTensor& t, int device) {
    TensorDesc d = t.desc();
    d.device_index = device;
    return d;
  };
  const int missing = device_count();
  Plan plan;
  const Status s = plan_forward({on(q, missing), on(q, missing), on(p, missing), {}}, c.options(), &plan);
  EXPECT_EQ(int(s.code()), int(Code::kInvalidArgument)) << s.message();
  EXPECT_NE(s.message().find("cuda:" + std::to_string(missing)), std::string::npos) << s.message();
}

TEST_F(GpuPlan, HostMemoryDescribedAsDeviceMemoryIsRefusedByTheLookUp) {
  const Inputs in = make_inputs(kCase, test_seed());
  Outputs out(kCase, kCase.dtype, kCase.layout);
  const auto on_cuda = [](const HostTensor& t) { return t.desc(nullptr, Device::kCUDA); };
  Plan plan;
  const Status s = plan_forward({on_cuda(in.q), on_cuda(in.k), on_cuda(out.p), {}}, kCase.options(), &plan);
  EXPECT_EQ(int(s.code()), int(Code::kInvalidArgument));
  EXPECT_EQ(s.message().rfind("q: data is not CUDA device memory", 0), 0u) << s.message();
}

// The autograd engine runs backward in threads of its own: a call from a thread that has never used CUDA (no
// current context) runs on its tensors' device.
TEST_F(GpuPlan, RunsFromAThreadThatNeverUsedCuda) {
  for (const int declared : {0, -1}) {
    GpuRun run(0, declared);
    Status status;
    std::thread([&] { status = run.launch(); }).join();
    ASSERT_TRUE(status.ok()) << status.message();
    run.check();
  }
}

// Two GPUs: every call on the device of its tensors, whichever is current, and never on two at once.
class MultiGpu : public GpuTest {
 protected:
  void SetUp() override {
    GpuTest::SetUp();
    if (!IsSkipped() && device_count() < 2) GTEST_SKIP() << "needs two CUDA devices";
  }
};

TEST_F(MultiGpu, RunsOnTheTensorsDeviceWhicheverIsCurrent) {
  for (const auto& [current, tensors] : {std::pair{0, 1}, {1, 0}}) {
    for (const int declared : {tensors, -1}) {
      SCOPED_TRACE("current cuda:" + std::to_string(current) + ", tensors on cuda:" + std::to_string(tensors) +
                   (declared < 0 ? " (looked up)" : " (declared)"));
      ASSERT_EQ(cudaSetDevice(current), cudaSuccess);
      expect_gpu_run_matches_cpu(tensors, declared);
      EXPECT_EQ(current_device(), current);
    }
  }
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
}

TEST_F(MultiGpu, TensorsOnTwoDevicesAreRefused) {
  const Case c{.B = 1, .Hq = 1, .Hk = 1, .Sq = 8, .Sk = 8, .D = 64};
  const Inputs in = make_inputs(c, test_seed());
  Outputs out(c, c.dtype, c.layout);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  const DeviceTensor q(in.q), p(out.p);
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  const DeviceTensor k(in.k);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  Plan plan;
  const Status s = plan_forward({q.desc(), k.desc(), p.desc(), {}}, c.options(), &plan);
  EXPECT_EQ(int(s.code()), int(Code::kInvalidArgument));
  EXPECT_EQ(s.message(), "k: expected memory of CUDA device 0 like q, got memory of device 1 (the tensors of a call "
                         "must be on one device)");
}

#endif  // QKSOFTMAX_TEST_CUDA

}  // namespace
}  // namespace qksoftmax::test
