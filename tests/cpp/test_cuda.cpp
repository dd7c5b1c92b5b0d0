// The CUDA backend through the public API (Device::kCUDA) against the CPU backend run on fp32 copies of the
// same (exactly representable) inputs. Every test is skipped where there is no GPU.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <functional>
#include <initializer_list>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cuda_util.h"
#include "test_util.h"

namespace qksoftmax::test {
namespace {

// With QKSOFTMAX_TEST_RESET_DEVICE=1 (the sanitizers' run) the CUDA context is destroyed at the end of the run,
// so that compute-sanitizer's leak check (memcheck --leak-check full) sees every device allocation still held.
class ResetDeviceAtExit : public ::testing::Environment {
 public:
  void TearDown() override {
    const char* value = std::getenv("QKSOFTMAX_TEST_RESET_DEVICE");
    if (value != nullptr && std::string_view(value) == "1" && gpu_available()) cudaDeviceReset();
  }
};

const auto* const kResetDeviceAtExit = ::testing::AddGlobalTestEnvironment(new ResetDeviceAtExit);

// The device twins of a case's inputs and outputs; outputs poisoned.
struct DeviceCase {
  DeviceTensor q, k, dp;
  std::optional<DeviceTensor> p, lse;
  DeviceTensor out_p, out_lse, dq, dk;

  DeviceCase(const Inputs& in, const Outputs& out)
      : q(in.q), k(in.k), dp(in.dp), out_p(out.p), out_lse(out.lse), dq(out.dq), dk(out.dk) {
    if (in.p) p.emplace(*in.p);
    if (in.lse) lse.emplace(*in.lse);
    for (DeviceTensor* t : {&out_p, &out_lse, &dq, &dk}) t->poison();
  }
};

// Forward into out.p / out.lse and backward into out.dq / out.dk, on the GPU.
Status gpu_run(const Case& c, const Inputs& in, Outputs& out) {
  const Stream stream;
  DeviceCase dev(in, out);
  const ForwardArgs fwd{dev.q.desc(), dev.k.desc(), dev.out_p.desc(), dev.out_lse.desc()};
  if (Status s = gpu_forward(fwd, c.options(), stream.get()); !s.ok()) return s;
  const BackwardArgs bwd = make_backward_args(dev.q, dev.k, dev.dp, dev.p, dev.lse, dev.dq.desc(), dev.dk.desc());
  if (Status s = gpu_backward(bwd, c.options(), stream.get()); !s.ok()) return s;
  for (auto [from, to] :
       {std::pair{&dev.out_p, &out.p}, {&dev.out_lse, &out.lse}, {&dev.dq, &out.dq}, {&dev.dk, &out.dk}}) {
    if (Status s = from->download(*to); !s.ok()) return s;
  }
  return {};
}

// The reference: the CPU backend on fp32 copies, so that its outputs are rounded to fp32 only.
Outputs cpu_reference(const Case& c, const Inputs& in) {
  Outputs ref(c, DType::kFloat32, Layout::kContiguous);
  const Status s = cpu_run(c, in.converted(DType::kFloat32), ref);
  EXPECT_TRUE(s.ok()) << "CPU reference: " << s.message();
  return ref;
}

void expect_matches(const Case& c, const Outputs& gpu, const Outputs& ref) {
  const double tolerance = accuracy::bound(c.dtype);
  expect_close("p", gpu.p, ref.p.values(), tolerance);
  expect_close("lse", gpu.lse, ref.lse.values(), accuracy::bound(DType::kFloat32));  // LSE is fp32
  expect_masked_zero(gpu.p, c.mask);
  expect_gradient_close(c, "dq", gpu.dq, ref.dq.values(), tolerance);
  expect_gradient_close(c, "dk", gpu.dk, ref.dk.values(), tolerance);
}

// Both passes on the GPU, checked against the CPU backend on the same inputs; `more` adds checks of its own
// on the same outputs and reference.
void expect_gpu_matches_cpu(const Case& c, const Inputs& in,
                            const std::function<void(const Outputs& gpu, const Outputs& ref)>& more = {}) {
  Outputs gpu(c, c.dtype, c.output_layout());
  const Status s = gpu_run(c, in, gpu);
  ASSERT_TRUE(s.ok()) << s.message();
  const Outputs ref = cpu_reference(c, in);
  expect_matches(c, gpu, ref);
  if (more) more(gpu, ref);
}

class GpuVsCpu : public GpuTest, public ::testing::WithParamInterface<Case> {};

TEST_P(GpuVsCpu, ForwardAndBackward) {
  const Case& c = GetParam();
  expect_gpu_matches_cpu(c, make_inputs(c, test_seed()));
}

std::vector<Case> sweep() {
  std::vector<Case> cases;
  int index = 0;  // rotates dtype or mode through the cases that do not sweep them
  const int64_t long_rows = small_shapes() ? 200 : 1000;  // many 64-row tiles and a cut one either way
  for (int64_t s : std::initializer_list<int64_t>{1, 7, 63, 64, 65, 127, 128, 129, long_rows}) {
    for (int64_t d : {64, 128}) {
      for (DType dtype : kAllDTypes) {
        for (Mask mask : kAllMasks) {
          for (Variant variant : kAllVariants) {
            cases.push_back({.B = 2, .Hq = 2, .Hk = 2, .Sq = s, .Sk = s, .D = d, .dtype = dtype, .mask = mask,
                             .variant = variant});
          }
        }
      }
    }
  }
  // The Hopper two-pass backward takes 16-bit, D = 128, TMA-aligned shapes (S a multiple of 8): its tile edges.
  for (int64_t s : {8, 72, 136, 520}) {
    for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
      for (Mask mask : kAllMasks) {
        for (Variant variant : kAllVariants) {
          cases.push_back({.B = 2, .Hq = 2, .Hk = 2, .Sq = s, .Sk = s, .D = 128, .dtype = dtype, .mask = mask,
                           .variant = variant});
        }
      }
    }
  }
  // Sizes around each 128-key edge (multiples of 8 keep TMA alignment): the single-pass backward in clusters of
  // 1, 2, 4, 8 CTAs up to 1024 keys, the two-pass backward past them (the generic kernels when deterministic).
  // Small shapes (the sanitizers' runs): one dtype per size, alternating, so that each dtype still meets
  // every cluster size.
  const std::vector<int64_t> edges = {120, 248, 256, 264, 504, 512, 1016, 1024, 1032};
  for (size_t e = 0; e < edges.size(); ++e) {
    const int64_t s = edges[e];
    for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
      if (!size_takes(dtype, e)) continue;
      for (Mask mask : kAllMasks) {
        for (Variant variant : kAllVariants) {
          for (bool deterministic : {false, true}) {
            cases.push_back({.B = 1, .Hq = 2, .Hk = 2, .Sq = s, .Sk = s, .D = 128, .dtype = dtype, .mask = mask,
                             .variant = variant, .deterministic = deterministic});
          }
        }
      }
    }
  }
  constexpr std::pair<int64_t, int64_t> kRectangles[] = {{65, 129}, {129, 65}, {1000, 7},
                                                          {7, 1000},  {1, 128},   {128, 1}};
  for (const auto& [sq, sk] : kRectangles) {
    for (Mask mask : kAllMasks) {
      cases.push_back({.B = 1, .Hq = 2, .Hk = 1, .Sq = sq, .Sk = sk, .D = 64, .dtype = kAllDTypes[index % 3],
                       .mask = mask, .variant = kAllVariants[index / 3 % 3]});
      ++index;
    }
  }
  for (int64_t hk : {2, 1}) {
    for (DType dtype : kAllDTypes) {
      for (Variant variant : kAllVariants) {
        cases.push_back({.B = 2, .Hq = 4, .Hk = hk, .Sq = 129, .Sk = 129, .D = index % 2 ? 64 : 128,
                         .dtype = dtype, .variant = variant});
        ++index;
      }
    }
  }
  for (Layout layout : {Layout::kPaddedRows, Layout::kOddPaddedRows, Layout::kHeadsTransposed}) {
    for (Variant variant : kAllVariants) {
      cases.push_back({.B = 2, .Hq = 4, .Hk = 2, .Sq = 200, .Sk = 200, .D = 64, .dtype = kAllDTypes[index % 3],
                       .mask = kAllMasks[index / 3 % 2], .variant = variant, .layout = layout});
      ++index;
    }
  }
  // The same situations on the Hopper path (16-bit, D = 128, S a multiple of 8): GQA, Sq != Sk, layouts.
  for (int64_t hk : {2, 1}) {
    for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
      for (Variant variant : kAllVariants) {
        cases.push_back({.B = 2, .Hq = 4, .Hk = hk, .Sq = 136, .Sk = 136, .D = 128, .dtype = dtype,
                         .variant = variant});
      }
    }
  }
  constexpr std::pair<int64_t, int64_t> kAlignedRectangles[] = {{72, 136}, {136, 72}, {8, 520}, {520, 8},
                                                                 {1032, 264}, {264, 1032}, {200, 1024}};
  for (const auto& [sq, sk] : kAlignedRectangles) {
    for (Mask mask : kAllMasks) {
      for (Variant variant : kAllVariants) {
        cases.push_back({.B = 1, .Hq = 2, .Hk = 1, .Sq = sq, .Sk = sk, .D = 128, .mask = mask, .variant = variant});
      }
    }
  }
  for (Layout layout : {Layout::kPaddedRows, Layout::kHeadsTransposed}) {
    for (Variant variant : kAllVariants) {
      cases.push_back({.B = 2, .Hq = 4, .Hk = 2, .Sq = 200, .Sk = 200, .D = 128, .dtype = DType::kFloat16,
                       .variant = variant, .layout = layout});
    }
  }
  // Inputs in TMA's reach and dQ alone with padded rows: the two-pass backward adds dQ into the fp32
  // accumulator where dQ is out of TMA's reach (odd padding), straight into its padded rows where it is not.
  for (Layout out : {Layout::kOddPaddedRows, Layout::kPaddedRows}) {
    for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
      for (Variant variant : kAllVariants) {
        cases.push_back({.B = 1, .Hq = 2, .Hk = 1, .Sq = 264, .Sk = 264, .D = 128, .dtype = dtype,
                         .variant = variant, .out_layout = out});
      }
    }
  }
  for (double scale : {0.3, 2.0}) {
    cases.push_back({.B = 1, .Hq = 2, .Hk = 1, .Sq = 128, .Sk = 128, .D = 128, .scale = scale});
  }
  // The two-pass backward folds the scale into dS in bf16 (in recompute its magnitude, the sign left to dQ and
  // dK), not in fp16: a negative scale and one above 1, with dQ added directly and through the accumulator (rows
  // out of TMA's reach); and a small scale in fp16 at 1024 keys, where a folded scale would push dS below fp16's
  // normal range. (A zero scale has no case: its zero gradients have no relative error to check.)
  for (Variant variant : kAllVariants) {
    cases.push_back({.B = 1, .Hq = 2, .Hk = 1, .Sq = 1024, .Sk = 1024, .D = 128, .dtype = DType::kFloat16,
                     .variant = variant, .scale = 1e-3});
  }
  for (double scale : {-0.7, 2.0}) {
    for (Layout out : {Layout::kOddPaddedRows, Layout::kPaddedRows}) {
      for (Variant variant : kAllVariants) {
        cases.push_back({.B = 1, .Hq = 2, .Hk = 1, .Sq = 264, .Sk = 264, .D = 128,
                         .dtype = kAllDTypes[index % 2], .variant = variant, .scale = scale, .out_layout = out});
        ++index;
      }
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Sweep, GpuVsCpu, ::testing::ValuesIn(sweep()), param_name);

// The single-pass Hopper backward (keys up to 1024 in one cluster) at the edges of its schedule: one CTA
// (S ≤ 128), clusters of 2, 4 and 8, row blocks of 64, key chunks of 32; rows made 16-byte aligned at every
// size so that TMA takes them. NaN sits in the masked places of dP and P (make_inputs). Deterministic calls:
// the single pass takes them at every size up to 1024 keys (by default only up to 128). Small shapes (the
// sanitizers' runs): one dtype per size, alternating, so that each dtype still meets every cluster size.
std::vector<Case> single_pass_cases() {
  std::vector<Case> cases;
  const std::vector<int64_t> sizes = {1, 63, 64, 65, 255, 256, 257, 511, 512, 513, 1023, 1024};
  for (size_t i = 0; i < sizes.size(); ++i) {
    const int64_t s = sizes[i];
    for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
      if (!size_takes(dtype, i)) continue;
      for (Mask mask : kAllMasks) {
        for (Variant variant : kAllVariants) {
          cases.push_back({.B = 1, .Hq = 2, .Hk = 1, .Sq = s, .Sk = s, .D = 128, .dtype = dtype, .mask = mask,
                           .variant = variant, .layout = Layout::kAlignedRows, .deterministic = true});
        }
      }
    }
  }
  // Small shapes (the sanitizers' run): one key head of two query heads, and 600 rows where 2000 serve only
  // volume (more rows than keys, a cut row block, as before).
  const int64_t batch = small_shapes() ? 1 : 2, kv_heads = small_shapes() ? 1 : 2;
  const int64_t many_rows = small_shapes() ? 600 : 2000;
  const std::pair<int64_t, int64_t> rectangles[] = {{63, 1024}, {1024, 63}, {1000, 300}, {many_rows, 520}, {5, 777}};
  for (const auto& [sq, sk] : rectangles) {
    for (Mask mask : kAllMasks) {
      for (Variant variant : kAllVariants) {
        cases.push_back({.B = batch, .Hq = 2 * kv_heads, .Hk = kv_heads, .Sq = sq, .Sk = sk, .D = 128, .mask = mask,
                         .variant = variant, .layout = Layout::kAlignedRows, .deterministic = true});
      }
    }
  }
  return cases;
}

class GpuSinglePass : public GpuTest, public ::testing::WithParamInterface<Case> {};

TEST_P(GpuSinglePass, ForwardAndBackward) {
  const Case& c = GetParam();
  expect_gpu_matches_cpu(c, make_inputs(c, test_seed()));
}

INSTANTIATE_TEST_SUITE_P(Edges, GpuSinglePass, ::testing::ValuesIn(single_pass_cases()), param_name);

// Where the single pass is the default (rows of up to 128 keys), calls without the deterministic option sum
// in a fixed order too: two runs are bitwise equal.
class GpuSinglePassRepeat : public GpuTest, public ::testing::WithParamInterface<Variant> {};

// Case c run twice on the same inputs: the outputs bitwise equal; the first run's in `a`.
void expect_runs_bitwise_equal(const Case& c, const Inputs& in, Outputs& a) {
  Outputs b(c, c.dtype, c.layout);
  const Status first = gpu_run(c, in, a);
  ASSERT_TRUE(first.ok()) << first.message();
  const Status second = gpu_run(c, in, b);
  ASSERT_TRUE(second.ok()) << second.message();
  expect_bitwise_equal(a, b);
}

TEST_P(GpuSinglePassRepeat, TwoRunsBitwiseEqual) {
  for (int64_t len : {128, 72}) {
    SCOPED_TRACE("S = " + std::to_string(len));
    const Case c{.B = 2, .Hq = 8, .Hk = 2, .Sq = len, .Sk = len, .D = 128, .variant = GetParam()};
    Outputs a(c, c.dtype, c.layout);
    expect_runs_bitwise_equal(c, make_inputs(c, test_seed()), a);
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, GpuSinglePassRepeat, ::testing::ValuesIn(kAllVariants), variant_param_name);

// The pingpong single pass (rows of up to 128 keys in one CTA, src/cuda/sm90/sp_pp_config.h), recompute and
// saved-P: more tiles than SMs (each CTA walks several, alternating its K buffers), one block a tile, grouped query
// heads, more rows than keys and fewer, a scale that dS must not fold wrongly (negative, above 1), dQ with padded
// rows. The sweeps above reach it at their small sizes too; these are its own edges.
std::vector<Case> keyblock_single_pass_cases() {
  std::vector<Case> cases;
  const int64_t wide = small_shapes() ? 40 : 150;  // (batch, key head) tiles per batch: past 132 SMs at B = 2
  cases.push_back({.B = 2, .Hq = wide, .Hk = wide, .Sq = 128, .Sk = 128, .D = 128});
  cases.push_back({.B = 2, .Hq = wide, .Hk = wide, .Sq = 64, .Sk = 64, .D = 128, .dtype = DType::kFloat16});
  cases.push_back({.B = 2, .Hq = 8, .Hk = 1, .Sq = 128, .Sk = 128, .D = 128, .dtype = DType::kFloat16});
  cases.push_back({.B = 1, .Hq = 4, .Hk = 2, .Sq = 1000, .Sk = 128, .D = 128});
  cases.push_back({.B = 1, .Hq = 4, .Hk = 2, .Sq = 40, .Sk = 128, .D = 128, .dtype = DType::kFloat16});
  cases.push_back({.B = 1, .Hq = 2, .Hk = 1, .Sq = 200, .Sk = 96, .D = 128, .mask = Mask::kNone});
  for (double scale : {-0.7, 2.0}) {
    for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
      cases.push_back({.B = 1, .Hq = 2, .Hk = 1, .Sq = 128, .Sk = 128, .D = 128, .dtype = dtype, .scale = scale});
    }
  }
  // dQ with padded rows: stored by TMA where its rows stay 16-byte aligned; out of TMA's reach (odd padding) the
  // cluster single pass takes the call.
  for (Layout out : {Layout::kPaddedRows, Layout::kOddPaddedRows}) {
    cases.push_back({.B = 2, .Hq = 4, .Hk = 2, .Sq = 104, .Sk = 104, .D = 128, .out_layout = out});
  }
  std::vector<Case> out;
  for (const Case& c : cases) {
    for (Variant variant : {Variant::kRecompute, Variant::kRecomputeLse, Variant::kSavedP}) {
      Case v = c;
      v.variant = variant;
      out.push_back(v);
    }
  }
  return out;
}

class GpuKeyBlockSinglePass : public GpuTest, public ::testing::WithParamInterface<Case> {};

TEST_P(GpuKeyBlockSinglePass, ForwardAndBackward) {
  const Case& c = GetParam();
  expect_gpu_matches_cpu(c, make_inputs(c, test_seed()));
}

INSTANTIATE_TEST_SUITE_P(Edges, GpuKeyBlockSinglePass, ::testing::ValuesIn(keyblock_single_pass_cases()), param_name);

// With options.deterministic, two runs are bitwise identical (dK sums over the query heads of a group), and
// they match the reference. S = 1000 and 512 reach the row-block single pass, which sums in a fixed order up to 1024
// keys in both modes; S = 256 the pingpong single pass in clusters of two (dQ: two parts added into zero, the same
// sum in either order); longer rows take the generic kernels.
class GpuDeterminism : public GpuTest, public ::testing::WithParamInterface<Variant> {};

TEST_P(GpuDeterminism, TwoRunsBitwiseEqual) {
  for (int64_t len : {1000, 512, 256}) {
    SCOPED_TRACE("S = " + std::to_string(len));
    const int64_t batch = small_shapes() ? 1 : 2, heads = small_shapes() ? 4 : 8;
    const Case c{.B = batch, .Hq = heads, .Hk = 1, .Sq = len, .Sk = len, .D = 128, .variant = GetParam(),
                 .deterministic = true};
    const Inputs in = make_inputs(c, test_seed());
    Outputs a(c, c.dtype, c.layout);
    expect_runs_bitwise_equal(c, in, a);
    expect_matches(c, a, cpu_reference(c, in));
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, GpuDeterminism, ::testing::ValuesIn(kAllVariants),
                         variant_param_name);

// dP with a large common part per row (dP = 8 + N(0, 1)): the softmax backward cancels it (dS = P ∘ (dP − D)),
// so a schedule that forms P∘dP and D·P separately and subtracts late would lose accuracy here while passing
// the zero-mean sweep. Every backward path: the single-pass and two-pass Hopper kernels, generic tails.
class GpuBiasedGradient : public GpuTest, public ::testing::WithParamInterface<Case> {};

TEST_P(GpuBiasedGradient, MatchesReference) {
  constexpr double kBias = 8.0;
  const Case& c = GetParam();
  Inputs in = make_inputs(c, test_seed());
  for (int64_t i = 0; i < in.dp.numel(); ++i) {
    const double v = in.dp.get(i);
    if (std::isfinite(v)) in.dp.set(i, v + kBias);  // the NaN planted in masked places stays
  }
  expect_gpu_matches_cpu(c, in);
}

std::vector<Case> biased_cases() {
  std::vector<Case> cases;
  for (int64_t s : {129, 136, 1032}) {
    for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
      for (Variant variant : kAllVariants) {
        for (bool deterministic : {false, true}) {
          cases.push_back({.B = 1, .Hq = 2, .Hk = 1, .Sq = s, .Sk = s, .D = 128, .dtype = dtype, .variant = variant,
                           .deterministic = deterministic});
        }
      }
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Bias, GpuBiasedGradient, ::testing::ValuesIn(biased_cases()), param_name);

// Many more (batch, head, row block) tiles than SMs: 1.8–3.9 64-row items per SM, so that a persistent
// kernel's CTAs take several each (reusing their buffers and barrier phases), with up to 16 key tiles per
// item; the last row block is cut at S = 200. The S = 512 case (3 items per SM, 8 key tiles) is the
// sanitizers' many-item case.
class GpuManyItems : public GpuTest, public ::testing::WithParamInterface<Case> {};

TEST_P(GpuManyItems, ForwardAndBackward) {
  const Case& c = GetParam();
  expect_gpu_matches_cpu(c, make_inputs(c, test_seed()));
}

INSTANTIATE_TEST_SUITE_P(
    Heads, GpuManyItems,
    ::testing::Values(Case{.B = 2, .Hq = 48, .Hk = 16, .Sq = 256, .Sk = 256, .D = 128},
                      Case{.B = 3, .Hq = 20, .Hk = 5, .Sq = 200, .Sk = 200, .D = 128, .dtype = DType::kFloat16},
                      Case{.B = 1, .Hq = small_shapes() ? 12 : 32, .Hk = small_shapes() ? 12 : 32, .Sq = 1024,
                           .Sk = 1024, .D = 128, .mask = Mask::kNone},
                      Case{.B = 1, .Hq = 48, .Hk = 48, .Sq = 512, .Sk = 512, .D = 128,
                           .variant = Variant::kSavedP}),
    param_name);

// The key-block pass at shapes with more key blocks than SMs, through the fp32 accumulator (rows of more than
// 1024 keys) and with dQ added directly (up to 1024): an odd key-block count, GQA, and causal Sk > Sq, where
// whole key blocks have no rows (their dK is zero). On 132 SMs the last three run persistent CTAs of up to
// five tiles each (640 tiles; kb_launch.cuh), so that every K buffer is loaded again and its barriers' phases
// wrap (two buffers with direct dQ, in recompute and in saved-P, one with the accumulator), the steps' turns
// carry across tiles, and the tile order has two sections of heads; causal Sk > Sq runs persistent too (tiles
// without steps among those with), the other causal shapes one CTA per tile. Small shapes (the sanitizers'
// runs) keep two to four tiles per CTA. Checked block by block (dQ by 64-row blocks, dK by 128-key blocks):
// one missing or misplaced tile among hundreds would vanish in one Frobenius norm over the tensor.
void expect_blocks_close(const char* name, const HostTensor& out, const std::vector<double>& ref, int64_t rows,
                         int64_t block_rows, int64_t d, double bound) {
  const std::vector<double> values = out.values();
  const int64_t blocks_per_head = (rows + block_rows - 1) / block_rows;
  const int64_t heads = int64_t(ref.size()) / (rows * d);
  std::vector<double> err(size_t(heads * blocks_per_head)), norm(err.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    const int64_t row = int64_t(i) / d, block = row / rows * blocks_per_head + row % rows / block_rows;
    err[block] += (values[i] - ref[i]) * (values[i] - ref[i]);
    norm[block] += ref[i] * ref[i];
  }
  int bad = 0;
  std::string first;  // the first few bad blocks and their relative errors
  for (size_t block = 0; block < err.size(); ++block) {
    const double relative = std::sqrt(err[block] / norm[block]);  // (inf or NaN where the reference is 0)
    const bool ok = norm[block] > 0 ? relative <= bound : err[block] == 0;
    if (!ok && bad++ < 3) first += " " + std::to_string(block) + " (" + std::to_string(relative) + ")";
  }
  EXPECT_EQ(bad, 0) << name << ": blocks above " << bound << ":" << first;
}

// The block check itself (on the host, no GPU): it passes a tensor within the bound in every block and fails
// one whose single 64-row block, among 48, is 5 % off (0.7 % over the whole tensor, which one norm passes).
TEST(BlockCheck, CatchesOneBadBlock) {
  constexpr int64_t kHeads = 3, kRows = 1000, kD = 8;
  HostTensor out(DType::kFloat32, {1, kHeads, kRows, kD});
  std::vector<double> ref(size_t(out.numel()));
  std::mt19937_64 rng(test_seed());
  std::normal_distribution<double> normal;
  for (int64_t i = 0; i < out.numel(); ++i) ref[i] = normal(rng), out.set(i, ref[i] * (1 + 1e-4));
  expect_blocks_close("ok", out, ref, kRows, 64, kD, 1e-2);
  const int64_t bad_row = kRows + 5 * 64;  // head 1, block 5
  for (int64_t i = bad_row * kD; i < (bad_row + 64) * kD; ++i) out.set(i, ref[i] * 1.05);
  EXPECT_NONFATAL_FAILURE(expect_blocks_close("bad", out, ref, kRows, 64, kD, 1e-2),
                          "bad: blocks above 0.01: 21 (0.05");
}

class GpuKeyBlocks : public GpuTest, public ::testing::WithParamInterface<Case> {};

// The outputs of case c checked as a whole and block by block: dQ by `row_block` rows, dK by `key_block` keys.
void expect_gpu_matches_cpu_by_blocks(const Case& c, int64_t row_block, int64_t key_block) {
  expect_gpu_matches_cpu(c, make_inputs(c, test_seed()), [&](const Outputs& gpu, const Outputs& ref) {
    const double tolerance = accuracy::bound(c.dtype);
    expect_blocks_close("dq", gpu.dq, ref.dq.values(), c.Sq, row_block, c.D, tolerance);
    expect_blocks_close("dk", gpu.dk, ref.dk.values(), c.Sk, key_block, c.D, tolerance);
  });
}

TEST_P(GpuKeyBlocks, EveryBlock) {
  constexpr int64_t kRowBlock = 64, kKeyBlock = 128;  // the key-block pass's tile: a step's rows, a CTA's keys
  expect_gpu_matches_cpu_by_blocks(GetParam(), kRowBlock, kKeyBlock);
}

// The key-block pass's CTAs (one per SM) take tiles from the tile counter: 160 tiles (S = 1160, 16 heads) give a
// few CTAs a second tile; 256 to 640 tiles (S = 1160 with 24–64 heads; in saved-P S = 760 with 48 key heads and
// S = 384 with 128–160 heads, row lengths that the pingpong single pass does not take) give each CTA several, in
// recompute and saved-P, bf16 and fp16, dQ added directly (Sk <= 1024) and through the accumulator; Sk > Sq causal
// (136 × 1160, 200 × 760) gives mostly tiles without steps, which the load thread runs through ahead of the
// others. (The recompute rows of 512 and 1016 keys go to the pingpong single pass in clusters of 4 and 8.)
INSTANTIATE_TEST_SUITE_P(
    Items, GpuKeyBlocks,
    ::testing::Values(Case{.B = 1, .Hq = 16, .Hk = 16, .Sq = 1160, .Sk = 1160, .D = 128},
                      Case{.B = 1, .Hq = 16, .Hk = 16, .Sq = 1160, .Sk = 1160, .D = 128, .dtype = DType::kFloat16,
                           .variant = Variant::kSavedP},
                      Case{.B = 1, .Hq = 16, .Hk = 16, .Sq = 1160, .Sk = 1160, .D = 128, .mask = Mask::kNone},
                      Case{.B = 2, .Hq = 32, .Hk = 16, .Sq = 136, .Sk = 1160, .D = 128,
                           .variant = Variant::kRecomputeLse},
                      Case{.B = 1, .Hq = 32, .Hk = 32, .Sq = 1016, .Sk = 1016, .D = 128},
                      Case{.B = 1, .Hq = 96, .Hk = 48, .Sq = 760, .Sk = 760, .D = 128, .dtype = DType::kFloat16,
                           .variant = Variant::kSavedP},
                      Case{.B = 1, .Hq = small_shapes() ? 128 : 160, .Hk = small_shapes() ? 128 : 160, .Sq = 512,
                           .Sk = 512, .D = 128},
                      Case{.B = 1, .Hq = small_shapes() ? 128 : 160, .Hk = small_shapes() ? 128 : 160, .Sq = 384,
                           .Sk = 384, .D = 128, .variant = Variant::kSavedP},
                      Case{.B = 1, .Hq = small_shapes() ? 24 : 64, .Hk = small_shapes() ? 24 : 64, .Sq = 1160,
                           .Sk = 1160, .D = 128, .dtype = DType::kFloat16, .mask = Mask::kNone,
                           .variant = Variant::kSavedP},
                      Case{.B = 1, .Hq = small_shapes() ? 24 : 64, .Hk = small_shapes() ? 24 : 64, .Sq = 1160,
                           .Sk = 1160, .D = 128},
                      Case{.B = 4, .Hq = 32, .Hk = 8, .Sq = 200, .Sk = 760, .D = 128, .variant = Variant::kSavedP}),
    param_name);

// The single pass with many more (batch, key head) items than resident clusters, so that each cluster walks
// several (K reloaded, barrier phases carried over), checked block by block: dQ by 64-row blocks, dK by the
// 32-key chunks that CTAs own in rotation.
class GpuSinglePassBlocks : public GpuTest, public ::testing::WithParamInterface<Case> {};

TEST_P(GpuSinglePassBlocks, EveryBlock) {
  constexpr int64_t kRowBlock = 64, kChunk = 32;  // a step's rows, the keys a CTA owns in rotation
  expect_gpu_matches_cpu_by_blocks(GetParam(), kRowBlock, kChunk);
}

// Items per case beyond the clusters resident at once (16 clusters of 8 CTAs on 132 SMs); small shapes (the
// sanitizers' runs): 20 items of 1024 keys rather than 80.
std::vector<Case> single_pass_block_cases() {
  const int64_t b = small_shapes() ? 1 : 2, h = small_shapes() ? 20 : 40;
  return {Case{.B = b, .Hq = h, .Hk = h, .Sq = 1024, .Sk = 1024, .D = 128, .deterministic = true},
          Case{.B = b, .Hq = h, .Hk = h, .Sq = 1024, .Sk = 1024, .D = 128, .dtype = DType::kFloat16,
               .variant = Variant::kSavedP, .deterministic = true},
          Case{.B = 3, .Hq = 64, .Hk = 16, .Sq = 520, .Sk = 520, .D = 128, .mask = Mask::kNone,
               .variant = Variant::kRecomputeLse, .deterministic = true},
          Case{.B = 4, .Hq = 96, .Hk = 96, .Sq = 128, .Sk = 128, .D = 128},
          // An odd number of steps per item (15 and 1): the exchange buffers' parity alternates from one item to
          // the next.
          Case{.B = 2, .Hq = 20, .Hk = 20, .Sq = 960, .Sk = 960, .D = 128, .deterministic = true},
          Case{.B = 3, .Hq = 50, .Hk = 50, .Sq = 64, .Sk = 64, .D = 128}};
}

INSTANTIATE_TEST_SUITE_P(Items, GpuSinglePassBlocks, ::testing::ValuesIn(single_pass_block_cases()), param_name);

// Forwards enqueued back to back, with no synchronisation between them, at a shape with ~16 row-block tiles
// per SM (a persistent forward that faulted at this scale passed at smaller ones). Every
// call's P and LSE must equal the first call's bit for bit (each output element is summed in a fixed order),
// and the first call's must match the CPU backend row by row: one wrong tile among 67M elements would vanish
// in a single Frobenius norm.
TEST_F(GpuTest, ForwardManyItemsRepeated) {
  constexpr int kRuns = 10;
  constexpr double kLseBound = 1e-4;  // per row, relative to 1 + |LSE|: a wrong tile moves it by ~1e-2
  const int64_t batch = small_shapes() ? 1 : 2, heads = small_shapes() ? 64 : 128;  // small: ~3.9 tiles per SM
  const Case c{.B = batch, .Hq = heads, .Hk = heads, .Sq = 512, .Sk = 512, .D = 128};
  std::mt19937_64 rng(test_seed());
  HostTensor q(c.dtype, c.q_shape()), k(c.dtype, c.k_shape());
  fill_normal(q, rng);
  fill_normal(k, rng);
  Outputs ref(c, DType::kFloat32, Layout::kContiguous);
  ASSERT_TRUE(cpu_forward(c, q.converted(DType::kFloat32), k.converted(DType::kFloat32), ref).ok());

  const Stream stream;
  const DeviceTensor dev_q(q), dev_k(k);
  std::vector<Outputs> runs;
  std::vector<DeviceTensor> dev_p, dev_lse;
  runs.reserve(kRuns);
  dev_p.reserve(kRuns);
  dev_lse.reserve(kRuns);
  for (int run = 0; run < kRuns; ++run) {
    runs.emplace_back(c, c.dtype, c.layout);
    dev_p.emplace_back(runs.back().p);
    dev_lse.emplace_back(runs.back().lse);
    dev_p.back().poison();
    dev_lse.back().poison();
  }
  const auto args = [&](int run) {
    return ForwardArgs{dev_q.desc(), dev_k.desc(), dev_p[run].desc(), dev_lse[run].desc()};
  };
  size_t bytes = 0;
  ASSERT_TRUE(forward_workspace_size(args(0), c.options(), &bytes).ok());
  const DeviceBuffer workspace(bytes);
  for (int run = 0; run < kRuns; ++run) {
    const Status s = forward(args(run), c.options(), workspace.get(), bytes, stream.get());
    ASSERT_TRUE(s.ok()) << "run " << run << ": " << s.message();
  }
  ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
  for (int run = 0; run < kRuns; ++run) {
    ASSERT_TRUE(dev_p[run].download(runs[run].p).ok());
    ASSERT_TRUE(dev_lse[run].download(runs[run].lse).ok());
  }
  for (int run = 1; run < kRuns; ++run) {
    EXPECT_TRUE(bitwise_equal(runs[run].p, runs[0].p)) << "P of run " << run << " differs from run 0's";
    EXPECT_TRUE(bitwise_equal(runs[run].lse, runs[0].lse)) << "LSE of run " << run << " differs from run 0's";
  }

  const HostTensor& p = runs[0].p;
  const double bound = accuracy::bound(c.dtype);
  int bad_rows = 0, bad_lse = 0;
  for (int64_t row = 0; row < c.B * c.Hq * c.Sq; ++row) {
    double diff = 0.0, norm = 0.0;
    for (int64_t j = 0; j < c.Sk; ++j) {
      const double want = ref.p.get(row * c.Sk + j), d = p.get(row * c.Sk + j) - want;
      diff += d * d;
      norm += want * want;
    }
    bad_rows += !(std::sqrt(diff) <= bound * std::sqrt(norm));  // NaN (poison left) counts as bad
    const double lse = runs[0].lse.get(row), want_lse = ref.lse.get(row);
    bad_lse += !(std::fabs(lse - want_lse) <= kLseBound * (1.0 + std::fabs(want_lse)));
  }
  EXPECT_EQ(bad_rows, 0) << "rows of P off the CPU backend's by more than " << bound << " (relative)";
  EXPECT_EQ(bad_lse, 0) << "rows whose LSE is off the CPU backend's";
  expect_masked_zero(p, c.mask);
}

// The forward without the optional lse output: on the generic path (S = 129) and the Hopper path (S = 136,
// 16-byte aligned rows).
class GpuForwardWithoutLse : public GpuTest, public ::testing::WithParamInterface<int64_t> {};

TEST_P(GpuForwardWithoutLse, MatchesReference) {
  const int64_t len = GetParam();
  const Case c{.B = 2, .Hq = 4, .Hk = 2, .Sq = len, .Sk = len, .D = 128};
  const Inputs in = make_inputs(c, test_seed());
  Outputs gpu(c, c.dtype, c.layout);
  const Stream stream;
  const DeviceTensor q(in.q), k(in.k);
  DeviceTensor p(gpu.p);
  p.poison();
  const Status s = gpu_forward({q.desc(), k.desc(), p.desc(), {}}, c.options(), stream.get());
  ASSERT_TRUE(s.ok()) << s.message();
  ASSERT_TRUE(p.download(gpu.p).ok());
  expect_close("p", gpu.p, cpu_reference(c, in).p.values(), accuracy::bound(c.dtype));
}

INSTANTIATE_TEST_SUITE_P(Lengths, GpuForwardWithoutLse, ::testing::Values(129, 136));

// An error that an earlier runtime call of the thread left as its last error (a failed allocation) is not the
// call's: forward and backward succeed and are right, on the generic, two-pass and fused Hopper paths.
class GpuAfterRuntimeError : public GpuTest, public ::testing::WithParamInterface<Case> {};

TEST_P(GpuAfterRuntimeError, CallsSucceed) {
  constexpr size_t kImpossibleBytes = size_t(1) << 62;
  void* never = nullptr;
  ASSERT_EQ(cudaMalloc(&never, kImpossibleBytes), cudaErrorMemoryAllocation);
  expect_gpu_matches_cpu(GetParam(), make_inputs(GetParam(), test_seed()));
}

INSTANTIATE_TEST_SUITE_P(
    Paths, GpuAfterRuntimeError,
    ::testing::Values(Case{.B = 1, .Hq = 2, .Hk = 1, .Sq = 129, .Sk = 129, .D = 64},
                      Case{.B = 1, .Hq = 2, .Hk = 1, .Sq = 136, .Sk = 136, .D = 128, .variant = Variant::kSavedP},
                      Case{.B = 1, .Hq = 2, .Hk = 1, .Sq = 136, .Sk = 136, .D = 128,
                           .variant = Variant::kRecomputeLse, .deterministic = true}),
    param_name);

// A contiguous device tensor's descriptor, for buffers too large to mirror on the host.
TensorDesc contiguous_device_desc(void* data, DType dtype, const std::vector<int64_t>& shape) {
  TensorDesc t{.data = data, .dtype = dtype, .device = Device::kCUDA, .rank = int(shape.size())};
  const std::vector<int64_t> strides = strides_for(shape, Layout::kContiguous);
  std::copy(shape.begin(), shape.end(), t.shape);
  std::copy(strides.begin(), strides.end(), t.stride);
  return t;
}

// Element offsets past 2^31 (byte offsets past 2^32): P and dP of 520 heads of 2048 × 2048. The first and
// last heads are checked against the CPU backend run on those heads alone.
TEST_F(GpuTest, IndexingPast2To31Elements) {
  constexpr int64_t kHeads = 520, kLen = 2048, kHeadDim = 64;
  const Case c{.Hq = kHeads, .Hk = kHeads, .Sq = kLen, .Sk = kLen, .D = kHeadDim};
  const Case head{.Sq = kLen, .Sk = kLen, .D = kHeadDim};
  ASSERT_GT(kHeads * kLen * kLen, int64_t(1) << 31);
  std::mt19937_64 rng(test_seed());
  HostTensor q(c.dtype, c.q_shape()), k(c.dtype, c.k_shape());
  fill_normal(q, rng);
  fill_normal(k, rng);
  // Every head gets the same dP: the host holds one head of it, the device all of them.
  HostTensor dp_head(c.dtype, head.probs_shape());
  fill_normal(dp_head, rng);
  plant_nan_in_masked(dp_head, c.mask);
  const size_t head_bytes = dp_head.storage().size();
  const auto head_at = [&](const DeviceBuffer& buffer, int64_t h) {
    return static_cast<std::byte*>(buffer.get()) + h * head_bytes;
  };

  const Stream stream;
  const DeviceTensor dev_q(q), dev_k(k);
  DeviceBuffer dp(head_bytes * kHeads), p(head_bytes * kHeads);
  for (int64_t h = 0; h < kHeads; ++h) {
    ASSERT_EQ(cudaMemcpy(head_at(dp, h), dp_head.storage().data(), head_bytes, cudaMemcpyHostToDevice), cudaSuccess);
  }
  ASSERT_EQ(cudaMemset(p.get(), kPoisonValue, p.bytes()), cudaSuccess);
  HostTensor lse(DType::kFloat32, c.lse_shape()), dq(c.dtype, c.q_shape()), dk(c.dtype, c.k_shape());
  DeviceTensor dev_lse(lse), dev_dq(dq), dev_dk(dk);
  for (DeviceTensor* t : {&dev_lse, &dev_dq, &dev_dk}) t->poison();

  const ForwardArgs fwd{dev_q.desc(), dev_k.desc(), contiguous_device_desc(p.get(), c.dtype, c.probs_shape()),
                        dev_lse.desc()};
  Status s = gpu_forward(fwd, c.options(), stream.get());
  ASSERT_TRUE(s.ok()) << s.message();
  const TensorDesc dp_desc = contiguous_device_desc(dp.get(), c.dtype, c.probs_shape());
  s = gpu_backward({.q = dev_q.desc(), .k = dev_k.desc(), .dp = dp_desc, .p = {}, .lse = {}, .dq = dev_dq.desc(),
                    .dk = dev_dk.desc()},
                   c.options(), stream.get());
  ASSERT_TRUE(s.ok()) << s.message();
  for (auto [from, to] : {std::pair{&dev_lse, &lse}, {&dev_dq, &dq}, {&dev_dk, &dk}}) {
    ASSERT_TRUE(from->download(*to).ok());
  }

  for (int64_t h : {int64_t(0), kHeads - 1}) {
    SCOPED_TRACE("head " + std::to_string(h));
    // Head h of a contiguous (1, kHeads, rows, cols) tensor, as a (1, 1, rows, cols) one.
    const auto slice = [&](const HostTensor& t, int64_t cols, DType dtype) {
      HostTensor out(dtype, {1, 1, t.shape()[2], cols});
      for (int64_t i = 0; i < out.numel(); ++i) out.set(i, t.get(h * out.numel() + i));
      return out;
    };
    const Inputs in{slice(q, kHeadDim, DType::kFloat32), slice(k, kHeadDim, DType::kFloat32),
                    dp_head.converted(DType::kFloat32), std::nullopt, std::nullopt};
    Outputs ref(head, DType::kFloat32, Layout::kContiguous);
    ASSERT_TRUE(cpu_run(head, in, ref).ok());

    HostTensor p_head(c.dtype, head.probs_shape());
    ASSERT_EQ(cudaMemcpy(p_head.storage().data(), head_at(p, h), head_bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    const double tolerance = accuracy::bound(c.dtype);
    expect_close("p", p_head, ref.p.values(), tolerance);
    expect_close("lse", slice(lse, 1, DType::kFloat32), ref.lse.values(), tolerance);
    expect_close("dq", slice(dq, kHeadDim, c.dtype), ref.dq.values(), tolerance);
    expect_close("dk", slice(dk, kHeadDim, c.dtype), ref.dk.values(), tolerance);
  }
}

}  // namespace
}  // namespace qksoftmax::test
