// Stress: forward and backward in every mode from several host threads at once (each on its own stream), under
// CUDA graph capture (captured once, replayed 100 times), with device memory exhausted, and repeated runs that
// must be bitwise identical on every deterministic path.
//
//   QKSOFTMAX_STRESS_SECONDS  how long the concurrent phase runs (default 60; the host tests cap it at 2)
//   QKSOFTMAX_STRESS_THREADS  host threads of the concurrent phase (default 4)
//   QKSOFTMAX_STRESS_JSON     where to write the counts of every phase (calls, checked, mismatches, errors)
//
// The GPU tests run in scripts/gpu-check.sh (stage stress), not in ctest; ctest runs the host tests: the CPU
// backend from several threads at once and repeated, each result bit for bit the same.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "cuda_util.h"
#include "test_util.h"

namespace qksoftmax::test {
namespace {

using Clock = std::chrono::steady_clock;

constexpr double kDefaultSeconds = 60;
constexpr double kHostSeconds = 2;
constexpr int kDefaultThreads = 4;
constexpr int kRepeats = 100;   // runs of each deterministic path, replays of each captured graph
constexpr int kCheckEvery = 4;  // concurrent phase: every 4th case of a thread is checked on the CPU
constexpr int64_t kMaxCheckedWork = int64_t(1) << 28;  // B·Hq·Sq·Sk·D of a case checked on the CPU
constexpr size_t kHogChunkBytes = size_t(1) << 30;
constexpr size_t kHogMinChunkBytes = size_t(1) << 20;

double env_number(const char* name, double fallback) {
  const char* value = std::getenv(name);
  return value ? std::atof(value) : fallback;
}

// What a phase did, for the JSON file.
struct Tally {
  std::atomic<int64_t> calls{0}, checked{0}, mismatches{0}, errors{0};
  std::string first_problem;
  std::mutex mutex;

  static constexpr int64_t kPrinted = 40;  // problems printed as they come (the log shows their spread)
  void problem(const std::string& what) {
    if (++mismatches <= kPrinted) std::fprintf(stderr, "stress: mismatch: %s\n", what.c_str());
    const std::lock_guard lock(mutex);
    if (first_problem.empty()) first_problem = what;
  }
  void error(const std::string& what) {
    ++errors;
    const std::lock_guard lock(mutex);
    if (first_problem.empty()) first_problem = what;
  }
};

std::map<std::string, Tally>& tallies() {
  static std::map<std::string, Tally> all;
  return all;
}

Tally& tally(const std::string& phase) {
  static std::mutex mutex;
  const std::lock_guard lock(mutex);
  return tallies()[phase];
}

// Writes every phase's counts after each test, so that a crash or a hang in one phase leaves the counts of those
// before it.
class JsonReport : public ::testing::EmptyTestEventListener {
 public:
  void OnTestEnd(const ::testing::TestInfo&) override { write(); }
  void OnTestProgramEnd(const ::testing::UnitTest&) override { write(); }

 private:
  static void write() {
    const char* path = std::getenv("QKSOFTMAX_STRESS_JSON");
    if (path == nullptr) return;
    std::ofstream out(path);
    out << "{";
    const char* sep = "";
    for (auto& [phase, t] : tallies()) {
      std::string problem;
      for (char ch : t.first_problem) problem += ch == '"' || ch == '\\' ? '\'' : ch;
      out << sep << "\"" << phase << "\": {\"calls\": " << t.calls << ", \"checked\": " << t.checked
          << ", \"mismatches\": " << t.mismatches << ", \"errors\": " << t.errors << ", \"first_problem\": \""
          << problem << "\"}";
      sep = ", ";
    }
    out << "}\n";
  }
};

const bool kReport = [] {
  ::testing::UnitTest::GetInstance()->listeners().Append(new JsonReport);
  return true;
}();

void expect_clean(Tally& t) {
  EXPECT_EQ(t.mismatches.load(), 0) << t.first_problem;
  EXPECT_EQ(t.errors.load(), 0) << t.first_problem;
  EXPECT_GT(t.calls.load(), 0);
}

Options options_of(const Case& c, Variant v) {
  Case with = c;
  with.variant = v;
  return with.options();
}

// A case of random shape, dtype, mask, layout and determinism (the variant is chosen per call).
Case random_case(std::mt19937_64& rng, bool cuda) {
  const auto pick = [&](const auto& values) {
    return values[std::uniform_int_distribution<size_t>(0, std::size(values) - 1)(rng)];
  };
  static constexpr int64_t kCudaLens[] = {1, 7, 64, 65, 129, 136, 200, 256, 264, 520, 1000, 1024, 1032};
  static constexpr int64_t kHostLens[] = {1, 7, 33, 65, 100};
  static constexpr int64_t kCudaHeadDims[] = {64, 128, 128};  // D = 128 twice: the Hopper kernels' shapes
  static constexpr int64_t kHostHeadDims[] = {8, 16, 64};
  static constexpr Layout kLayouts[] = {Layout::kContiguous, Layout::kContiguous, Layout::kPaddedRows,
                                        Layout::kOddPaddedRows, Layout::kHeadsTransposed};
  Case c;
  c.B = pick(std::array<int64_t, 2>{1, 2});
  c.Hk = pick(std::array<int64_t, 2>{1, 2});
  c.Hq = c.Hk * pick(std::array<int64_t, 3>{1, 2, 4});
  c.Sq = cuda ? pick(kCudaLens) : pick(kHostLens);
  c.Sk = std::bernoulli_distribution(0.7)(rng) ? c.Sq : cuda ? pick(kCudaLens) : pick(kHostLens);
  c.D = cuda ? pick(kCudaHeadDims) : pick(kHostHeadDims);
  c.dtype = pick(kAllDTypes);
  c.mask = pick(kAllMasks);
  c.layout = pick(kLayouts);
  c.deterministic = std::bernoulli_distribution(0.3)(rng);
  return c;
}

// ---- The host tests (ctest): the CPU backend from several threads, and repeated.

Outputs host_run(const Case& c, const Inputs& in) {
  Outputs out(c, c.dtype, c.layout);
  const Status s = cpu_run(c, in, out);
  if (!s.ok()) ADD_FAILURE() << s.message();
  return out;
}

bool outputs_equal(const Outputs& a, const Outputs& b) {
  return bitwise_equal(a.p, b.p) && bitwise_equal(a.lse, b.lse) && bitwise_equal(a.dq, b.dq) &&
         bitwise_equal(a.dk, b.dk);
}

TEST(StressCpu, ConcurrentCallsAreRepeatable) {
  Tally& t = tally("cpu_concurrent");
  const double seconds = std::min(env_number("QKSOFTMAX_STRESS_SECONDS", kHostSeconds), kHostSeconds);
  const int threads = int(env_number("QKSOFTMAX_STRESS_THREADS", kDefaultThreads));
  const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  std::vector<std::thread> workers;
  for (int w = 0; w < threads; ++w) {
    workers.emplace_back([&, w] {
      std::mt19937_64 rng(test_seed() + uint64_t(w));
      while (Clock::now() < deadline) {
        Case c = random_case(rng, false);
        c.variant = kAllVariants[std::uniform_int_distribution<int>(0, 2)(rng)];
        const Inputs in = make_inputs(c, rng());
        const Outputs first = host_run(c, in), second = host_run(c, in);
        t.calls += 4;
        ++t.checked;
        if (!outputs_equal(first, second)) t.problem(case_name(c) + ": two runs differ");
      }
    });
  }
  for (std::thread& w : workers) w.join();
  expect_clean(t);
}

TEST(StressCpu, RepeatedRunsBitwiseEqual) {
  Tally& t = tally("cpu_repeat");
  for (Variant v : kAllVariants) {
    const Case c{.B = 2, .Hq = 4, .Hk = 2, .Sq = 33, .Sk = 40, .D = 16, .variant = v, .layout = Layout::kOddPaddedRows};
    const Inputs in = make_inputs(c, test_seed());
    const Outputs first = host_run(c, in);
    for (int run = 1; run < kRepeats; ++run) {
      t.calls += 2;
      ++t.checked;
      if (!outputs_equal(host_run(c, in), first)) t.problem(case_name(c) + ": run " + std::to_string(run));
    }
  }
  expect_clean(t);
}

// ---- The GPU tests.

// A workspace that grows to the largest size asked of it (one per stream: calls on a stream run in order).
class Workspace {
 public:
  void* reserve(size_t bytes) {
    if (bytes > (buffer_ ? buffer_->bytes() : 0)) {
      buffer_.reset();
      buffer_.emplace(bytes);
    }
    return buffer_ ? buffer_->get() : nullptr;
  }
  size_t bytes() const { return buffer_ ? buffer_->bytes() : 0; }

 private:
  std::optional<DeviceBuffer> buffer_;
};

// One case on the device: inputs, the forward's P and LSE, and dQ, dK of each backward variant, all poisoned.
struct GpuCase {
  Case c;
  HostTensor q, k, dp;
  Outputs out;                     // p, lse of the forward
  std::vector<HostTensor> dq, dk;  // per variant
  DeviceTensor dev_q, dev_k, dev_dp, dev_p, dev_lse;
  std::vector<DeviceTensor> dev_dq, dev_dk;

  GpuCase(const Case& cc, std::mt19937_64& rng)
      : c(cc),
        q(filled(c.dtype, c.q_shape(), c.layout, rng)),
        k(filled(c.dtype, c.k_shape(), c.layout, rng)),
        dp(filled(c.dtype, c.probs_shape(), c.layout, rng, c.mask)),
        out(c, c.dtype, c.layout),
        dev_q(q),
        dev_k(k),
        dev_dp(dp),
        dev_p(out.p),
        dev_lse(out.lse) {
    dq.reserve(std::size(kAllVariants));
    dk.reserve(std::size(kAllVariants));
    dev_dq.reserve(std::size(kAllVariants));
    dev_dk.reserve(std::size(kAllVariants));
    for (size_t v = 0; v < std::size(kAllVariants); ++v) {
      dq.emplace_back(c.dtype, c.q_shape(), c.layout);
      dk.emplace_back(c.dtype, c.k_shape(), c.layout);
      dev_dq.emplace_back(dq.back());
      dev_dk.emplace_back(dk.back());
    }
    poison();
  }

  // N(0, 1) values; for dp (given its mask) NaN where masked, which no call may read.
  static HostTensor filled(DType dtype, std::vector<int64_t> shape, Layout layout, std::mt19937_64& rng,
                           std::optional<Mask> mask = std::nullopt) {
    HostTensor t(dtype, std::move(shape), layout);
    fill_normal(t, rng);
    if (mask) plant_nan_in_masked(t, *mask);
    return t;
  }

  // Poisons every output. cudaMemset (and the uploads before it) run on the legacy default stream, which the
  // non-blocking streams of the calls do not wait for: it is waited for here.
  void poison() {
    dev_p.poison();
    dev_lse.poison();
    for (DeviceTensor& t : dev_dq) t.poison();
    for (DeviceTensor& t : dev_dk) t.poison();
    EXPECT_EQ(cudaStreamSynchronize(cudaStreamLegacy), cudaSuccess);
  }
  ForwardArgs forward_args() const { return {dev_q.desc(), dev_k.desc(), dev_p.desc(), dev_lse.desc()}; }
  BackwardArgs backward_args(size_t v) const {
    BackwardArgs a{.q = dev_q.desc(),
                   .k = dev_k.desc(),
                   .dp = dev_dp.desc(),
                   .p = {},
                   .lse = {},
                   .dq = dev_dq[v].desc(),
                   .dk = dev_dk[v].desc()};
    if (kAllVariants[v] == Variant::kSavedP) a.p = dev_p.desc();
    if (kAllVariants[v] == Variant::kRecomputeLse) a.lse = dev_lse.desc();
    return a;
  }

  // Enqueues the forward, then each backward variant on its output, on the stream; counts the calls.
  Status enqueue(cudaStream_t stream, Workspace& workspace, Tally& t) {
    size_t bytes = 0, most = 0;
    if (Status s = forward_workspace_size(forward_args(), c.options(), &bytes); !s.ok()) return s;
    most = bytes;
    for (size_t v = 0; v < std::size(kAllVariants); ++v) {
      if (Status s = backward_workspace_size(backward_args(v), options_of(c, kAllVariants[v]), &bytes); !s.ok())
        return s;
      most = std::max(most, bytes);
    }
    void* ws = workspace.reserve(most);
    ++t.calls;
    if (Status s = forward(forward_args(), c.options(), ws, workspace.bytes(), stream); !s.ok()) return s;
    for (size_t v = 0; v < std::size(kAllVariants); ++v) {
      ++t.calls;
      const Status s = backward(backward_args(v), options_of(c, kAllVariants[v]), ws, workspace.bytes(), stream);
      if (!s.ok()) return s;
    }
    return {};
  }

  // Copies every output (padding included) back into the host tensors.
  Status download() {
    if (Status s = dev_p.download(out.p); !s.ok()) return s;
    if (Status s = dev_lse.download(out.lse); !s.ok()) return s;
    for (size_t v = 0; v < dq.size(); ++v) {
      if (Status s = dev_dq[v].download(dq[v]); !s.ok()) return s;
      if (Status s = dev_dk[v].download(dk[v]); !s.ok()) return s;
    }
    return {};
  }

  // The downloaded outputs against the CPU backend on fp32 copies: the forward on q and k, each backward on
  // the P or LSE that the device's forward gave it. Returns what is wrong, empty if nothing.
  std::string check() const {
    std::string wrong;
    const auto note = [&](const std::string& what, double err, double bound) {
      if (!(err <= bound)) wrong += " " + what + " " + std::to_string(err);
    };
    const double bound = accuracy::bound(c.dtype);
    const Inputs in{q.converted(DType::kFloat32), k.converted(DType::kFloat32), dp.converted(DType::kFloat32),
                    out.p.converted(DType::kFloat32), out.lse.converted(DType::kFloat32)};
    Outputs ref(c, DType::kFloat32, Layout::kContiguous);
    if (!cpu_forward(c, in.q, in.k, ref).ok()) return " CPU forward refused";
    note("p", relative_error(out.p.values(), ref.p.values()), bound);
    note("lse", relative_error(out.lse.values(), ref.lse.values()), accuracy::bound(DType::kFloat32));
    for (const HostTensor* t : {&out.p, &out.lse}) {
      if (!t->padding_untouched()) wrong += " written outside a forward output";
    }
    for (size_t v = 0; v < dq.size(); ++v) {
      const Variant variant = kAllVariants[v];
      // References to in's tensors, not copies: `cond ? in.p : std::nullopt` would copy P into a temporary that
      // dies with the statement, leaving the descriptor pointing at freed memory (every check of the saved-P and
      // given-LSE variants failed so on the H200).
      const std::optional<HostTensor> none;
      const std::optional<HostTensor>& p = variant == Variant::kSavedP ? in.p : none;
      const std::optional<HostTensor>& lse = variant == Variant::kRecomputeLse ? in.lse : none;
      const BackwardArgs args = make_backward_args(in.q, in.k, in.dp, p, lse, ref.dq.desc(), ref.dk.desc());
      if (!backward(args, options_of(c, variant), nullptr, 0, nullptr).ok()) return " CPU backward refused";
      for (const auto& [name, got, want] : {std::tuple{"dq", &dq[v], &ref.dq}, {"dk", &dk[v], &ref.dk}}) {
        const std::vector<double> g = got->values(), w = want->values();
        double err = relative_error(g, w);
        if (gradients_vanish(c)) {  // rounding noise: absolute terms (see expect_gradient_close)
          err = 0;
          for (size_t i = 0; i < w.size(); ++i)
            err = std::isnan(g[i] - w[i]) ? g[i] - w[i] : std::max(err, std::fabs(g[i] - w[i]));
        }
        note(std::string(variant_name(variant)) + " " + name, err, bound);
        if (!got->padding_untouched()) wrong += std::string(" ") + name + " written outside its view";
      }
    }
    return wrong;
  }
};

int64_t work_of(const Case& c) { return c.B * c.Hq * c.Sq * c.Sk * c.D; }

class GpuStress : public GpuTest {};

// Every thread on its own stream: random cases, each forward then the three backward variants enqueued without
// waiting, every kCheckEvery-th (small enough) case checked against the CPU backend.
TEST_F(GpuStress, ThreadsOnStreams) {
  Tally& t = tally("concurrent");
  const double seconds = env_number("QKSOFTMAX_STRESS_SECONDS", kDefaultSeconds);
  const int threads = int(env_number("QKSOFTMAX_STRESS_THREADS", kDefaultThreads));
  const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  std::atomic<bool> stop{false};
  int device = 0;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  std::vector<std::thread> workers;
  for (int w = 0; w < threads; ++w) {
    workers.emplace_back([&, w] {
      cudaSetDevice(device);
      std::mt19937_64 rng(test_seed() + uint64_t(w));
      const Stream stream(cudaStreamNonBlocking);
      Workspace workspace;
      for (int64_t n = 0; Clock::now() < deadline && !stop; ++n) {
        GpuCase g(random_case(rng, true), rng);
        if (Status s = g.enqueue(stream.get(), workspace, t); !s.ok()) t.error(case_name(g.c) + ": " + s.message());
        if (cudaError_t err = cudaStreamSynchronize(stream.get()); err != cudaSuccess) {
          t.error(case_name(g.c) + ": " + cudaGetErrorString(err));
          stop = true;  // a device error ends the phase: the context may be lost
          return;
        }
        if (n % kCheckEvery != 0 || work_of(g.c) > kMaxCheckedWork) continue;
        if (Status s = g.download(); !s.ok()) {
          t.error(s.message());
          continue;
        }
        t.checked += 4;
        if (const std::string wrong = g.check(); !wrong.empty()) t.problem(case_name(g.c) + ":" + wrong);
      }
    });
  }
  for (std::thread& w : workers) w.join();
  expect_clean(t);
}

// The cases of the graph and repeat phases: the generic kernels and the Hopper ones, each dtype once.
std::vector<Case> path_cases() {
  return {Case{.B = 1, .Hq = 2, .Hk = 1, .Sq = 129, .Sk = 129, .D = 64, .dtype = DType::kFloat16},
          Case{.B = 1, .Hq = 4, .Hk = 2, .Sq = 200, .Sk = 200, .D = 128, .dtype = DType::kFloat32},
          Case{.B = 2, .Hq = 4, .Hk = 2, .Sq = 520, .Sk = 520, .D = 128},
          Case{.B = 1, .Hq = 2, .Hk = 1, .Sq = 1032, .Sk = 1032, .D = 128, .mask = Mask::kNone}};
}

// What repeated runs must reproduce: bit for bit where the path is deterministic (every forward; the backward
// when asked), within the accuracy bound of the first run otherwise (dQ atomics). Returns what differs.
std::string compare_runs(const GpuCase& now, const GpuCase& first) {
  std::string wrong;
  if (!bitwise_equal(now.out.p, first.out.p)) wrong += " p";
  if (!bitwise_equal(now.out.lse, first.out.lse)) wrong += " lse";
  for (size_t v = 0; v < now.dq.size(); ++v) {
    for (const auto& [name, a, b] : {std::tuple{"dq", &now.dq[v], &first.dq[v]}, {"dk", &now.dk[v], &first.dk[v]}}) {
      const bool same = now.c.deterministic
                            ? bitwise_equal(*a, *b)
                            : relative_error(a->values(), b->values()) <= accuracy::bound(now.c.dtype);
      if (!same) wrong += std::string(" ") + variant_name(kAllVariants[v]) + " " + name;
    }
  }
  return wrong;
}

// Same inputs, same outputs: 100 runs of each path into poisoned outputs, each bit for bit the first run's
// (deterministic backward), the first checked against the CPU backend.
TEST_F(GpuStress, RepeatedRunsBitwiseEqual) {
  Tally& t = tally("repeat");
  for (Case c : path_cases()) {
    c.deterministic = true;
    std::mt19937_64 rng(test_seed());
    GpuCase first(c, rng);
    std::mt19937_64 same_rng(test_seed());
    GpuCase again(c, same_rng);
    const Stream stream(cudaStreamNonBlocking);
    Workspace workspace;
    ASSERT_TRUE(first.enqueue(stream.get(), workspace, t).ok());
    ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
    ASSERT_TRUE(first.download().ok());
    ++t.checked;
    if (const std::string wrong = first.check(); !wrong.empty()) t.problem(case_name(c) + ":" + wrong);
    for (int run = 1; run < kRepeats; ++run) {
      again.poison();
      if (Status s = again.enqueue(stream.get(), workspace, t); !s.ok()) t.error(s.message());
      ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
      ASSERT_TRUE(again.download().ok());
      ++t.checked;
      if (const std::string wrong = compare_runs(again, first); !wrong.empty()) {
        t.problem(case_name(c) + ": run " + std::to_string(run) + ":" + wrong);
      }
    }
  }
  expect_clean(t);
}

// Forward and the three backward variants captured into one CUDA graph, replayed 100 times into poisoned
// outputs; every replay must give what the same calls gave outside the graph.
TEST_F(GpuStress, GraphReplay) {
  Tally& t = tally("graph");
  for (const Case& path : path_cases()) {
    for (bool deterministic : {false, true}) {
      Case c = path;
      c.deterministic = deterministic;
      std::mt19937_64 rng(test_seed()), same_rng(test_seed());
      GpuCase eager(c, rng), captured(c, same_rng);
      const Stream stream(cudaStreamNonBlocking);
      Workspace workspace;
      ASSERT_TRUE(eager.enqueue(stream.get(), workspace, t).ok());
      ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
      ASSERT_TRUE(eager.download().ok());

      cudaGraph_t graph = nullptr;
      ASSERT_EQ(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeGlobal), cudaSuccess);
      const Status captured_status = captured.enqueue(stream.get(), workspace, t);
      const cudaError_t end = cudaStreamEndCapture(stream.get(), &graph);
      ASSERT_TRUE(captured_status.ok()) << captured_status.message();
      ASSERT_EQ(end, cudaSuccess) << cudaGetErrorString(end);
      cudaGraphExec_t exec = nullptr;
      ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
      for (int replay = 0; replay < kRepeats; ++replay) {
        captured.poison();
        ASSERT_EQ(cudaGraphLaunch(exec, stream.get()), cudaSuccess);
        ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
        ASSERT_TRUE(captured.download().ok());
        t.calls += 4;
        ++t.checked;
        if (const std::string wrong = compare_runs(captured, eager); !wrong.empty()) {
          t.problem(case_name(c) + ": replay " + std::to_string(replay) + ":" + wrong);
        }
      }
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(graph);
    }
  }
  expect_clean(t);
}

// Device memory taken until an allocation fails, the failure left as the thread's last error. A caller whose
// workspace allocation failed passes none: refused (kWorkspaceTooSmall), nothing written. Calls with the
// buffers allocated before work and give what they gave before; so do calls after the memory is given back.
TEST_F(GpuStress, MemoryExhausted) {
  Tally& t = tally("memory");
  int refusals_tried = 0;
  for (const Case& path : path_cases()) {
    Case c = path;
    c.deterministic = true;
    std::mt19937_64 rng(test_seed()), rng2(test_seed()), rng3(test_seed());
    GpuCase before(c, rng), under(c, rng2), after(c, rng3);
    const Stream stream(cudaStreamNonBlocking);
    Workspace workspace;
    ASSERT_TRUE(before.enqueue(stream.get(), workspace, t).ok());
    ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
    ASSERT_TRUE(before.download().ok());

    std::vector<void*> hog;
    for (size_t chunk = kHogChunkBytes; chunk >= kHogMinChunkBytes;) {
      void* p = nullptr;
      if (cudaMalloc(&p, chunk) == cudaSuccess) {
        hog.push_back(p);
      } else {
        chunk /= 2;  // the failure stays the thread's last error
      }
    }
    size_t free_bytes = 0, total_bytes = 0;
    cudaMemGetInfo(&free_bytes, &total_bytes);
    SCOPED_TRACE(case_name(c) + ": " + std::to_string(free_bytes) + " bytes left free");

    // The refused call: no workspace where the kernel that runs needs one (the two passes keep LSE, D and the
    // dQ accumulator there; the single pass needs none). The plan knows which kernel runs; the size query,
    // from shapes alone, is an upper bound.
    const BackwardArgs args = under.backward_args(0);
    Plan plan;
    ASSERT_TRUE(plan_backward(args, options_of(c, Variant::kRecompute), &plan).ok());
    if (plan.workspace_bytes() > 0) {
      ++refusals_tried;
      ++t.calls;
      const Status s = backward(args, options_of(c, Variant::kRecompute), nullptr, 0, stream.get());
      if (s.code() != Code::kWorkspaceTooSmall) t.problem("no workspace: " + s.message());
      ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
      ASSERT_TRUE(under.download().ok());
      const std::vector<std::byte>& dq = under.dq[0].storage();
      if (!std::all_of(dq.begin(), dq.end(), [](std::byte b) { return b == kPoisonByte; })) {
        t.problem("a refused call wrote dq");
      }
    }
    if (Status s = under.enqueue(stream.get(), workspace, t); !s.ok()) t.error("memory exhausted: " + s.message());
    ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
    ASSERT_TRUE(under.download().ok());
    ++t.checked;
    if (const std::string wrong = compare_runs(under, before); !wrong.empty()) t.problem("memory exhausted:" + wrong);

    for (void* p : hog) cudaFree(p);
    if (Status s = after.enqueue(stream.get(), workspace, t); !s.ok()) t.error("memory given back: " + s.message());
    ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
    ASSERT_TRUE(after.download().ok());
    ++t.checked;
    if (const std::string wrong = compare_runs(after, before); !wrong.empty()) t.problem("memory given back:" + wrong);
  }
  EXPECT_GT(refusals_tried, 0) << "no path case needs a workspace: the refusal went untested";
  expect_clean(t);
}

}  // namespace
}  // namespace qksoftmax::test
